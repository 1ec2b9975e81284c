"""The bytes of mempool transactions in flight (`tx_bytes`), for SQLite and PostgreSQL: a small
transaction `utxo enqueue tx` registers travels with its registration (one write per batch,
where a blob per transaction cost a file or a PUT each); large ones go to the blob store as
blocks do (workers/runtime/txsource.py says which is read from where).

Invariants:
- A transaction's bytes are written in the same transaction as its pending message and its
  recovery entry (`add_pending_many`), so every message a worker can take, and every recovery
  entry the manager can claim, finds them; they are never replaced (a txid names its bytes).
- They stay while anyone may still need them: its message is pending, or its recovery entry is
  (the manager applies a tx whose message was lost, and tries a refused one again until its
  grace ends). The release that makes the entry terminal deletes them when no message is
  pending, in its own write; `sweep_tx_bytes` deletes the rest (a message finished after its
  entry ended), so the table holds about the mempool. A copy of a message that comes after its
  tx was settled finds no bytes: the worker then asks the store and the entry
  (workers/runtime/txsource.py), it does not refuse a tx that was applied.
- On PostgreSQL, where writes run side by side, a registration that keeps bytes holds a shared
  advisory lock (BYTES_LOCK) and a write that deletes them the exclusive one, each from the
  start of its transaction: a deletion's look for a pending message never misses a registration
  in flight (READ COMMITTED would not show it one), and neither side waits on the other's rows
  while holding the lock the other wants. SQLite runs one writer at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stores.sqldb import Database, chunks

IN_CHUNK = 500  # ids per `IN (…)` list
BYTES_LOCK = 0x54584259  # "TXBY": PostgreSQL advisory lock between keeping and deleting bytes


def lock_bytes(db: Database, cur: Any, exclusive: bool) -> None:
    """Inside a write unit, first: the side of BYTES_LOCK this write takes (see the module)."""
    if db.dialect == "postgresql":
        cur.execute(f"SELECT pg_advisory_xact_lock{'' if exclusive else '_shared'}(%s)", (BYTES_LOCK,))


def txbytes_ddl(blob: str) -> list[str]:
    return [f"CREATE TABLE IF NOT EXISTS tx_bytes (ident TEXT PRIMARY KEY, raw {blob} NOT NULL)"]


def keep_tx_bytes(db: Database, cur: Any, kept: Mapping[str, bytes]) -> None:
    """Inside a write unit (the registration's): the bytes of these message ids."""
    if kept:
        sql = db.q("INSERT INTO tx_bytes (ident, raw) VALUES (?, ?) ON CONFLICT (ident) DO NOTHING")
        cur.executemany(sql, list(kept.items()))


def drop_tx_bytes(db: Database, cur: Any, ident: str) -> None:
    """Inside a write unit that took `lock_bytes(exclusive=True)` first (a recovery entry made
    terminal): its bytes, unless its message is pending (sent again meanwhile)."""
    cur.execute(db.q("DELETE FROM tx_bytes WHERE ident = ? AND NOT EXISTS "
                     "(SELECT 1 FROM pending WHERE pending.ident = ?)"), (ident, ident))


class TxBytes:
    """The tx-bytes methods of SqlStateStore (which provides `db`)."""

    db: Database

    def tx_bytes(self, idents: Sequence[str]) -> dict[str, bytes]:
        """See the protocol (StateStore.tx_bytes)."""

        def q(cur: Any) -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            for part in chunks(idents, IN_CHUNK):
                cur.execute(self.db.q(f"SELECT ident, raw FROM tx_bytes WHERE ident IN "
                                      f"({', '.join('?' * len(part))})"), tuple(part))
                out.update((str(i), bytes(r)) for i, r in cur.fetchall())
            return out

        return self.db.read("tx bytes", q) if idents else {}

    def sweep_tx_bytes(self) -> int:
        """See the protocol (StateStore.sweep_tx_bytes)."""

        def unit(cur: Any) -> int:
            lock_bytes(self.db, cur, exclusive=True)
            cur.execute(
                "DELETE FROM tx_bytes WHERE "
                "NOT EXISTS (SELECT 1 FROM pending WHERE pending.ident = tx_bytes.ident) AND "
                "NOT EXISTS (SELECT 1 FROM recovery WHERE recovery.ident = tx_bytes.ident "
                "AND recovery.status = 'pending')"
            )
            return int(cur.rowcount or 0)

        return self.db.write("sweep tx bytes", unit, idempotent=True)
