"""Child pages on SQL, and the record-level calls the two-phase coordinator drives
(`stores.utxo.twophase.PagedRecords`).

Invariants:
- Every page is its own database transaction, create-only: a million-output transaction never
  holds one giant transaction, several workers can write pages at once, and a page that exists
  already (an earlier attempt's) is left as it is.
- The master's `creating` is cleared in the same database transaction that checks that every
  child exists with its own flag clear; so a clear master always means a complete transaction.
- Spends, unspends and per-output changes read and write a child page only under its master's
  lock (SQLite: the database's write lock; PostgreSQL: the master row FOR UPDATE first, then
  the pages FOR UPDATE, in key order). Creation writes pages without it: while the master is
  `creating` nothing else writes them.
- A creating master has a `tx_creations` row with the creation's options (frozen, …), removed
  in the transaction that clears the master's flag.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from chain import hash_to_hex
from stores.utxo import slots, twophase, validate
from stores.utxo.errors import ProcessingError, TxNotFound
from stores.utxo.external import ExternalTxs
from stores.utxo.pages import CreationState, MasterRecord, Page
from stores.utxo.sql.base import SqlBase
from stores.utxo.sql.schema import INSERT_TX

INSERT_PAGE = (
    "INSERT INTO tx_pages (txid, page, creating, total_utxos, spent_utxos, utxos) "
    "VALUES (?, ?, 1, ?, 0, ?) ON CONFLICT (txid, page) DO NOTHING"
)
SET_PAGE = "UPDATE tx_pages SET utxos = ?, spent_utxos = ? WHERE txid = ? AND page = ?"
NEXT_PAGE = "SELECT page, utxos FROM tx_pages WHERE txid = ? AND page > ? ORDER BY page LIMIT 1"
RAW_NONE = 0  # the record keeps no transaction bytes: they are in the blob store (external)


class PageRow:
    """A child page read under its master's lock, with a mutable copy of its slots."""

    __slots__ = ("changed", "creating", "index", "spent", "total", "txid", "utxos")

    def __init__(self, r: tuple[Any, ...]) -> None:
        self.txid = bytes(r[0])
        self.index: int = r[1]
        self.creating = bool(r[2])
        self.total: int = r[3]
        self.spent: int = r[4]
        self.utxos = bytearray(r[5])
        self.changed = False


def master_row(rec: MasterRecord, creating: bool) -> list[Any]:
    """The `INSERT_TX` values of an external record (its id, first, is filled in on insert)."""
    return [
        0, rec.txid, rec.version, rec.locktime, rec.fee, rec.size_in_bytes, int(rec.is_coinbase),
        rec.spending_height, int(rec.locked), int(creating), int(rec.conflicting), rec.unmined_since,
        rec.created_at, None, rec.delete_at_height, 1, rec.total_extra_recs, rec.total_utxos, 0,
        json.dumps([list(b) for b in rec.blocks], separators=(",", ":")), b"", "[]", "{}",
        b"".join(t + v.to_bytes(4, "little") for t, v in rec.inpoints), rec.utxos, RAW_NONE, None,
    ]


class PageMixin(SqlBase):
    batch_size: int
    max_tx_size_in_store: int
    externalize_all: bool
    external: ExternalTxs

    # -- the coordinator's calls -------------------------------------------------------------
    def create_master(
        self, rec: MasterRecord, creating: bool = True, options: dict[str, Any] | None = None
    ) -> bool:
        """Insert the master record, create-only; False when it exists already. A creating
        master keeps the creation's `options` beside it until its flag clears."""
        row = master_row(rec, creating)

        def unit(cur: Any) -> bool:
            row[0] = self._reserve_ids(cur, 1)[0]
            cur.execute(self._q(INSERT_TX), row)
            made = bool(cur.rowcount == 1)
            if made and creating:
                cur.execute(
                    self._q(
                        "INSERT INTO tx_creations (txid, options) VALUES (?, ?) ON CONFLICT (txid) DO NOTHING"
                    ),
                    (rec.txid, json.dumps(options or {}, separators=(",", ":"))),
                )
            return made

        return self._run_write(f"create the master record of tx {hash_to_hex(rec.txid)}", unit)

    def create_page(self, page: Page) -> bool:
        """Insert one child page with `creating` set, create-only; False when it exists."""
        validate.hash32("txid", page.txid)

        def unit(cur: Any) -> bool:
            cur.execute(self._q(INSERT_PAGE), (page.txid, page.index, page.n_utxos, page.utxos))
            return bool(cur.rowcount == 1)

        return self._run_write(f"create page {page.index} of tx {hash_to_hex(page.txid)}", unit)

    def creation_state(self, txid: bytes) -> CreationState | None:
        validate.hash32("txid", txid)

        def q(cur: Any) -> tuple[Any, list[int], Any]:
            rows = self._select_txs(cur, "creating, total_extra_recs, utxos", [txid], False)
            cur.execute(self._q("SELECT page FROM tx_pages WHERE txid = ?"), (txid,))
            pages = [r[0] for r in cur.fetchall()]
            cur.execute(self._q("SELECT options FROM tx_creations WHERE txid = ?"), (txid,))
            return (rows[0] if rows else None), pages, cur.fetchone()

        master, pages, opts = self._run_read("creation_state", q)
        if master is None:
            return None
        if opts is not None:
            frozen = bool(json.loads(opts[0]).get("frozen", False))
        else:  # a creation without recorded options: its master's slots tell
            utxos = bytes(master[2])
            real = [utxos[k + 32 : k + slots.SLOT] for k in range(0, len(utxos), slots.SLOT)
                    if not utxos.startswith(slots.NO_HASH, k)]
            frozen = bool(real) and all(s == slots.FROZEN for s in real)
        return CreationState(
            creating=bool(master[0]), total_extra_recs=master[1], pages=frozenset([0, *pages]), frozen=frozen
        )

    def clear_creating_children(self, txid: bytes) -> int:
        def unit(cur: Any) -> int:
            cur.execute(self._q("UPDATE tx_pages SET creating = 0 WHERE txid = ? AND creating = 1"), (txid,))
            return int(cur.rowcount)

        return self._run_write(f"clear creating on the child pages of tx {hash_to_hex(txid)}", unit)

    def clear_creating_master(self, txid: bytes) -> bool:
        """Clear the master's flag once every child exists with its flag clear."""

        def unit(cur: Any) -> bool:
            rows = self._select_txs(cur, "creating, total_extra_recs", [txid], True)
            if not rows:
                raise TxNotFound(f"tx {hash_to_hex(txid)} not found", txid=txid)
            creating, extra = rows[0]
            if not creating:
                return True
            cur.execute(
                self._q("SELECT COUNT(*), COALESCE(SUM(creating), 0) FROM tx_pages WHERE txid = ?"), (txid,)
            )
            n, still = cur.fetchone()
            if n != extra or still:
                raise ProcessingError(
                    f"tx {hash_to_hex(txid)}: {n} of {extra} child pages exist, {still} still creating",
                    txid=txid,
                )
            cur.execute(self._q("UPDATE txs SET creating = 0 WHERE txid = ?"), (txid,))
            cur.execute(self._q("DELETE FROM tx_creations WHERE txid = ?"), (txid,))
            # A dead creator's lock row whose TTL has passed has nothing left to guard.
            cur.execute(
                self._q("DELETE FROM tx_locks WHERE txid = ? AND expires_at <= ?"),
                (txid, int(time.time() * 1000)),
            )
            return True

        return self._run_write(f"clear creating on the master record of tx {hash_to_hex(txid)}", unit)

    def complete_creation(self, txid: bytes, block_height: int | None = None) -> bool:
        """Finish a half-done creation of `txid` (see `twophase.complete_creation`)."""
        validate.hash32("txid", txid)
        return twophase.complete_creation(self, txid, block_height)  # type: ignore[arg-type]

    # -- pages under a master's lock ---------------------------------------------------------
    def _lock_pages(
        self, cur: Any, keys: Iterable[tuple[bytes, int]], lock: bool = True
    ) -> dict[tuple[bytes, int], PageRow]:
        """The pages with these (txid, index) keys, in key order (in a write unit on
        PostgreSQL: FOR UPDATE; `lock=False` for reads)."""
        out: dict[tuple[bytes, int], PageRow] = {}
        sql = self._q(
            "SELECT txid, page, creating, total_utxos, spent_utxos, utxos FROM tx_pages "
            f"WHERE txid = ? AND page = ?{self.for_update if lock else ''}"
        )
        for key in sorted(set(keys)):
            cur.execute(sql, key)
            r = cur.fetchone()
            if r is not None:
                out[key] = PageRow(r)
        return out

    def _write_pages(self, cur: Any, pages: Iterable[PageRow]) -> None:
        rows = [(p.utxos, p.spent, p.txid, p.index) for p in pages if p.changed]
        if rows:
            cur.executemany(self._q(SET_PAGE), rows)

    def _page_slots(self, txid: bytes) -> Iterator[tuple[int, bytes]]:
        """(index, slots) of every child page of `txid`, in index order, one page at a time."""
        last = 0
        while True:

            def q(cur: Any, after: int = last) -> Any:
                cur.execute(self._q(NEXT_PAGE), (txid, after))
                return cur.fetchone()

            r = self._run_read("read page", q)
            if r is None:
                return
            last = r[0]
            yield r[0], bytes(r[1])
