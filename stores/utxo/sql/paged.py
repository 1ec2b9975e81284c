"""Child pages on SQL: the record-level calls the two-phase coordinator drives
(`stores.utxo.twophase.PagedRecords`).

Invariants:
- Every page is its own database transaction, create-only: a million-output transaction never
  holds one giant transaction, several workers can write pages at once, and a page that exists
  already (an earlier attempt's) is left as it is.
- The master's `creating` is cleared in the same database transaction that checks that every
  child exists with its own flag clear; so a clear master always means a complete transaction.
- A creating master has a `tx_creations` row with the creation's options (frozen, …), removed
  in the transaction that clears the master's flag.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from chain import hash_to_hex
from stores.utxo import slots, twophase, validate
from stores.utxo.errors import TxNotFound
from stores.utxo.kernel.record import Record
from stores.utxo.sql import codec
from stores.utxo.sql.locks import LockMixin
from stores.utxo.sql.scriptindex import live_entries


class PagedMixin(LockMixin):
    def create_master(
        self, rec: Record, creating: bool = True, options: dict[str, Any] | None = None
    ) -> bool:
        """Insert an external master record, create-only; False when it exists already. A
        creating master keeps the creation's `options` beside it until its flag clears."""
        row = codec.values(rec)
        row[codec.TX_COLS.index("creating")] = int(creating)

        def unit(cur: Any) -> bool:
            row[0] = self._reserve_ids(cur, 1)[0]
            cur.execute(self.db.q(codec.INSERT_TX), row)
            made = bool(cur.rowcount == 1)
            if made and creating:
                cur.execute(
                    self.db.q(
                        "INSERT INTO tx_creations (txid, options) VALUES (?, ?) ON CONFLICT (txid) DO NOTHING"
                    ),
                    (rec.txid, json.dumps(options or {}, separators=(",", ":"))),
                )
            return made

        return self.db.write(f"create the master record of tx {hash_to_hex(rec.txid)}", unit)

    def create_page(self, page: Record) -> bool:
        """Insert one child page with `creating` set, create-only; False when it exists."""
        validate.hash32("txid", page.txid)
        values = codec.page_values(page)

        def unit(cur: Any) -> bool:
            cur.execute(self.db.q(codec.INSERT_PAGE), values)
            return bool(cur.rowcount == 1)

        return self.db.write(f"create page {page.page} of tx {hash_to_hex(page.txid)}", unit)

    def creation_state(self, txid: bytes) -> twophase.CreationState | None:
        validate.hash32("txid", txid)

        def q(cur: Any) -> tuple[Any, list[int], Any]:
            master = self.db.select_in(
                cur, "SELECT creating, total_extra_recs, utxos FROM txs WHERE txid", [txid]
            )
            cur.execute(self.db.q("SELECT page FROM tx_pages WHERE txid = ?"), (txid,))
            pages = [r[0] for r in cur.fetchall()]
            cur.execute(self.db.q("SELECT options FROM tx_creations WHERE txid = ?"), (txid,))
            return (master[0] if master else None), pages, cur.fetchone()

        master, pages, opts = self.db.read("creation_state", q)
        if master is None:
            return None
        if opts is not None:
            frozen = bool(json.loads(opts[0]).get("frozen", False))
        else:  # a creation without recorded options: its master's slots tell
            utxos = bytes(master[2])
            real = [
                utxos[k + 32 : k + slots.SLOT]
                for k in range(0, len(utxos), slots.SLOT)
                if not utxos.startswith(slots.NO_HASH, k)
            ]
            frozen = bool(real) and all(s == slots.FROZEN for s in real)
        return twophase.CreationState(
            creating=bool(master[0]), total_extra_recs=master[1], pages=frozenset([0, *pages]), frozen=frozen
        )

    def clear_creating_children(self, txid: bytes) -> int:
        def unit(cur: Any) -> int:
            cur.execute(
                self.db.q("UPDATE tx_pages SET creating = 0 WHERE txid = ? AND creating = 1"), (txid,)
            )
            return int(cur.rowcount)

        return self.db.write(f"clear creating on the child pages of tx {hash_to_hex(txid)}", unit)

    def clear_creating_master(self, txid: bytes) -> bool:
        """Clear the master's flag once every child exists with its flag clear."""

        def unit(cur: Any) -> bool:
            rows = self.db.select_in(
                cur, "SELECT creating, total_extra_recs FROM txs WHERE txid", [txid], lock=True
            )
            if not rows:
                raise TxNotFound(f"tx {hash_to_hex(txid)} not found", txid=txid)
            creating, extra = rows[0]
            if not creating:
                return True
            cur.execute(
                self.db.q("SELECT COUNT(*), COALESCE(SUM(creating), 0) FROM tx_pages WHERE txid = ?"), (txid,)
            )
            n, still = cur.fetchone()
            twophase.check_pages_whole(txid, n, extra, still)
            cur.execute(self.db.q("UPDATE txs SET creating = 0 WHERE txid = ?"), (txid,))
            cur.execute(self.db.q("DELETE FROM tx_creations WHERE txid = ?"), (txid,))
            self._index_created(cur, txid)
            # A dead creator's lock row whose TTL has passed has nothing left to guard.
            cur.execute(
                self.db.q("DELETE FROM tx_locks WHERE txid = ? AND expires_at <= ?"),
                (txid, int(time.time() * 1000)),
            )
            return True

        return self.db.write(f"clear creating on the master record of tx {hash_to_hex(txid)}", unit)

    def _index_created(self, cur: Any, txid: bytes) -> None:
        """A multi-record tx becomes whole: every output's script index entry (none was spent:
        a record being created cannot be), a page at a time (a million outputs are 50 pages)."""
        cur.execute(self.db.q("SELECT id, utxos, script_keys FROM txs WHERE txid = ?"), (txid,))
        r = cur.fetchone()
        at = self._indexed_to(cur)
        if at is not None and r[0] > at:
            return  # not yet in the table's part: a query scans it, the mark takes it in later
        master = Record(txid, bytearray(r[1]), 0, 0, id=r[0], script_keys=bytes(r[2]))
        self._index_rows(cur, live_entries(master, master, 0))
        self._index_pages(cur, master)

    def complete_creation(self, txid: bytes, block_height: int | None = None) -> bool:
        """Finish a half-done creation of `txid` (see `twophase.complete_creation`)."""
        validate.hash32("txid", txid)
        return twophase.complete_creation(self, txid, block_height)

    def _page_slots(self, txid: bytes) -> Iterator[tuple[int, bytes]]:
        """(index, slots) of every child page of `txid`, in index order, one page at a time."""
        last = 0
        while True:

            def q(cur: Any, after: int = last) -> Any:
                cur.execute(
                    self.db.q(
                        "SELECT page, utxos FROM tx_pages WHERE txid = ? AND page > ? ORDER BY page LIMIT 1"
                    ),
                    (txid, after),
                )
                return cur.fetchone()

            r = self.db.read("read page", q)
            if r is None:
                return
            last = r[0]
            yield r[0], bytes(r[1])
