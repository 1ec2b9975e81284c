"""What every SQL operation of the UTXO store stands on: loading records under lock, writing
back what the kernel changed, and the store's height.

Invariants:
- Every change runs inside one write unit of `stores.sqldb` that holds the write lock for the
  records it loads (SQLite: the whole database; PostgreSQL: the `txs` rows FOR UPDATE in txid
  order, then the child pages it needs FOR UPDATE in key order, so that concurrent units cannot
  deadlock), decides with the kernel, and writes back in the same unit. A unit is all or
  nothing, and is retried whole on a transient conflict.
- A child page is read and written only under its master's lock.
- A spend is judged at the caller's height (its block's); the delete-at-height and the other
  state rules count from the higher of the caller's height and the store's (another process
  may have moved the store on since this one last looked).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from chain import hash_to_hex
from stores.sqldb import Database
from stores.utxo import pagesize, validate
from stores.utxo.errors import StorageError, TxNotFound, UtxoError
from stores.utxo.external import ExternalTxs
from stores.utxo.kernel.record import Record
from stores.utxo.sql import codec

T = TypeVar("T")
SCHEMA_VERSION = "utxoflow-sql-8"  # bump on any change existing stores cannot be read with


class SqlBase:
    """The state and helpers every concern of the SQL store shares (set up by `SqlUtxoStore`)."""

    db: Database
    url: str
    block_height: int
    retention: int
    batch_size: int
    index_lag: int
    max_tx_size_in_store: int
    externalize_all: bool
    external: ExternalTxs

    @property
    def url_safe(self) -> str:
        return self.db.url_safe

    def _reserve_ids(self, cur: Any, n: int) -> list[int]:
        """n fresh `txs.id` values, increasing (inside a write unit): the backend's own."""
        raise NotImplementedError

    def height_for(self, hint: int = 0) -> int:
        """The height a rule counts from: the caller's or the store's, whichever is higher."""
        return max(self.block_height, hint)

    # -- records under lock ---------------------------------------------------------------------
    def _records(
        self,
        cur: Any,
        txids: Iterable[bytes],
        lock: bool = True,
        want: Iterable[tuple[bytes, int]] = (),
        proj: codec.Projection = codec.RULES,
    ) -> dict[bytes, Record]:
        """The master records of `txids` (locked in a write unit), each with the child pages that
        hold the outpoints in `want` (only multi-record transactions have any), loading the
        columns of `proj` (`codec.RULES` by default: what the rules read)."""
        keys = sorted(set(txids))
        found: dict[bytes, Record] = {}
        decode = proj.decode
        for r in self.db.select_in(cur, f"SELECT {proj.select} FROM txs WHERE txid", keys, lock):
            rec = decode(r)
            found[rec.txid] = rec
        if any(rec.total_extra_recs for rec in found.values()):
            size = self.batch_size
            pages = {
                (t, v // size)
                for t, v in want
                if v >= size and (m := found.get(t)) is not None and m.total_extra_recs
            }
            for (t, _k), pg in self._pages(cur, pages, lock).items():
                found[t].pages[pg.page] = pg
        return found

    def _pages(
        self, cur: Any, keys: Iterable[tuple[bytes, int]], lock: bool = True
    ) -> dict[tuple[bytes, int], Record]:
        """The child pages with these (txid, index) keys, in key order."""
        sql = self.db.q(
            f"SELECT {codec.PAGE.select} FROM tx_pages WHERE txid = ? AND page = ?"
            f"{self.db.for_update if lock else ''}"
        )
        out: dict[tuple[bytes, int], Record] = {}
        for key in sorted(set(keys)):
            cur.execute(sql, key)
            r = cur.fetchone()
            if r is not None:
                out[key] = codec.PAGE.decode(r)
        return out

    def _write(self, cur: Any, records: Iterable[Record]) -> None:
        """Write back what the kernel touched in these masters and their loaded pages."""
        recs = [r for rec in records for r in (rec, *rec.pages.values())]
        for sql, rows in codec.updates(recs):
            self._update_rows(cur, sql, rows)

    def _update_rows(self, cur: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """`sql` (one of `codec.updates`' statements) for each of `rows`."""
        cur.executemany(self.db.q(sql), rows)

    def _change(
        self,
        what: str,
        txids: Sequence[bytes],
        change: Callable[[Record], None],
        missing_ok: bool = True,
    ) -> list[UtxoError | None]:
        """Apply `change` to each record under lock and write it back; TxNotFound for a missing
        one (with `missing_ok` off, the whole call changes nothing then)."""
        validate.txids(txids)

        def unit(cur: Any) -> list[UtxoError | None]:
            recs = self._records(cur, txids)
            result: list[UtxoError | None] = []
            for t in txids:
                rec = recs.get(t)
                if rec is None:
                    err = TxNotFound(f"tx {hash_to_hex(t)} not found", txid=t)
                    if not missing_ok:
                        raise err  # inside the unit: nothing of the call is applied
                    result.append(err)
                    continue
                change(rec)
                result.append(None)
            self._write(cur, recs.values())
            return result

        return self.db.write(what, unit)

    def _txids_where(self, what: str, where: str, params: tuple[Any, ...]) -> list[bytes]:
        def q(cur: Any) -> list[bytes]:
            cur.execute(self.db.q(f"SELECT txid FROM txs WHERE {where}"), params)
            return [bytes(r[0]) for r in cur.fetchall()]

        return self.db.read(what, q)

    # -- the store's own values -----------------------------------------------------------------
    def _set_meta(self, cur: Any, key: str, value: str) -> None:
        cur.execute(self.db.q("DELETE FROM meta WHERE key = ?"), (key,))
        cur.execute(self.db.q("INSERT INTO meta (key, value) VALUES (?, ?)"), (key, value))

    def _meta(self, cur: Any, key: str) -> str | None:
        cur.execute(self.db.q("SELECT value FROM meta WHERE key = ?"), (key,))
        r = cur.fetchone()
        return None if r is None else str(r[0])

    def identity(self) -> str:
        def unit(cur: Any) -> str | None:
            cur.execute(self.db.q("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"),
                        ("store_id", uuid.uuid4().hex))
            return self._meta(cur, "store_id")

        found = self.db.read("identity", lambda cur: self._meta(cur, "store_id"))
        return found or str(self.db.write("identity", unit))

    def set_block_height(self, height: int) -> None:
        validate.height("block height", height, zero_ok=False)
        self.db.write("set_block_height", lambda cur: self._set_meta(cur, "block_height", str(height)))
        before, self.block_height = self.block_height, height
        # (inside `fused`: the next block of a batch counts from it; rolled back, it goes back)
        self.db.on_rollback(lambda: setattr(self, "block_height", before))

    def current_height(self) -> int:
        """The store's height, read afresh (another process may have moved it on)."""
        self.block_height = max(self.block_height, self.db.read("read block height", self._stored_height))
        return self.block_height

    def _stored_height(self, cur: Any) -> int:
        """The block height persisted by set_block_height (0 before the first)."""
        return int(self._meta(cur, "block_height") or 0)

    def _check_schema(self, cur: Any, existed: bool) -> None:
        """Stamp a new store with SCHEMA_VERSION, its batch size and its script index lag; refuse
        one written by an incompatible version; use the batch size (`stores.utxo.pagesize`) and
        the lag it was created with."""
        found = self._meta(cur, "schema")
        if found is None and not existed:
            self._set_meta(cur, "schema", SCHEMA_VERSION)
        elif found != SCHEMA_VERSION:
            raise StorageError(
                f"{self.url_safe} holds a UTXO store of schema {found or 'unversioned'!r}; this version "
                f"needs {SCHEMA_VERSION!r} (point UTXO_STORE_URL at a new store)"
            )
        size = self._meta(cur, "batch_size")
        if size is None:
            self._set_meta(cur, "batch_size", str(self.batch_size))
        else:
            self.batch_size = pagesize.adopt(self.url_safe, int(size), self.batch_size)
        # The script index's lag is the store's, as its batch size: a table kept without one holds
        # every record's entries, one kept with one only those below its mark (`sql/scriptindex.py`).
        lag = self._meta(cur, "index_lag")
        if lag is None:
            self._set_meta(cur, "index_lag", str(self.index_lag))
        else:
            self.index_lag = int(lag)
