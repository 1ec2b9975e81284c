"""The state store's log of refusals (`refusals`), for SQLite and PostgreSQL: why a mempool
transaction was refused, and the rival that holds the output it wanted, or why a block was (a
refused transaction leaves no record in the UTXO store, so this is the only place its reason
survives its task; a block keeps its reason in the index too). `utxo wait` reports those no
earlier wait reported, `utxo tx` and `utxo status` show them.

Invariants:
- A transaction's refusal is written in the same transaction that takes its message off the
  registry of pending messages (`remove_pending`), so whoever sees the message finished sees
  why. A block's is written by the holder right after the commit that refuses it, before the
  pass that refused it lets its message go (`Sequencer._invalidate`, `BlockIndex._add`).
- One row per message id (the latest refusal, with a new seq); an id finished as accepted loses
  its row. Rows are numbered in the order they were written (`seq`).
- The log keeps the last KEEP refusals: older rows go as new ones come (refusals are rare; a
  flood of double spends cannot grow it without bound).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from stores.sqldb import Database, chunks, increasing_key
from stores.state.protocol import Refusal

KEEP = 10_000
IN_CHUNK = 500
COLS = "ident, kind, key, reason, rival, at, seq"


def refusals_ddl(dialect: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS refusals (
            seq {increasing_key(dialect)},
            ident TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            reason TEXT NOT NULL,
            rival TEXT,
            at BIGINT NOT NULL
        )""",
    ]


def _refusal(r: Any) -> Refusal:
    rival = None if r[4] is None else str(r[4])
    return Refusal(str(r[0]), str(r[1]), str(r[2]), str(r[3]), rival, r[5] / 1000, int(r[6]))


def note_refusal(
    db: Database, cur: Any, ident: str, kind: str, key: str, reason: str, rival: str | None
) -> None:
    """Inside a write unit: `ident` refused (replacing an earlier refusal of it), the oldest rows
    past KEEP dropped."""
    cur.execute(db.q("DELETE FROM refusals WHERE ident = ?"), (ident,))
    cur.execute(db.q("INSERT INTO refusals (ident, kind, key, reason, rival, at) VALUES (?, ?, ?, ?, ?, ?)"),
                (ident, kind, key, reason, rival, int(time.time() * 1000)))
    cur.execute(db.q("DELETE FROM refusals WHERE seq <= (SELECT MAX(seq) FROM refusals) - ?"), (KEEP,))


def forget_refusal(db: Database, cur: Any, ident: str) -> None:
    cur.execute(db.q("DELETE FROM refusals WHERE ident = ?"), (ident,))


class RefusalLog:
    """The refusal-log reads of SqlStateStore (which provides `db`)."""

    db: Database

    def refusals(self, idents: Sequence[str]) -> dict[str, Refusal]:
        def q(cur: Any) -> dict[str, Refusal]:
            out: dict[str, Refusal] = {}
            for part in chunks(idents, IN_CHUNK):
                marks = ",".join("?" * len(part))
                cur.execute(self.db.q(f"SELECT {COLS} FROM refusals WHERE ident IN ({marks})"), list(part))
                out.update((str(r[0]), _refusal(r)) for r in cur.fetchall())
            return out

        return self.db.read("refusals", q) if idents else {}

    def note_refusal(self, ident: str, kind: str, key: str, reason: str, rival: str | None = None) -> None:
        self.db.write("note refusal", lambda cur: note_refusal(self.db, cur, ident, kind, key, reason, rival),
                      idempotent=True)  # a refusal replaced: twice is once

    def forget_refusals(self, idents: Sequence[str]) -> None:
        def unit(cur: Any) -> None:
            for ident in idents:
                forget_refusal(self.db, cur, ident)

        if idents:
            self.db.write("forget refusals", unit, idempotent=True)

    def refusals_since(self, seq: int, limit: int = 1000) -> list[Refusal]:
        def q(cur: Any) -> list[Refusal]:
            sql = f"SELECT {COLS} FROM refusals WHERE seq > ? ORDER BY seq LIMIT ?"
            cur.execute(self.db.q(sql), (seq, limit))
            return [_refusal(r) for r in cur.fetchall()]

        return self.db.read("refusals since", q)

    def last_refusals(self, limit: int = 10) -> list[Refusal]:
        def q(cur: Any) -> list[Refusal]:
            cur.execute(self.db.q(f"SELECT {COLS} FROM refusals ORDER BY seq DESC LIMIT ?"), (limit,))
            return [_refusal(r) for r in cur.fetchall()]

        return self.db.read("last refusals", q)
