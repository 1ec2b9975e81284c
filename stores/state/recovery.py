"""The recovery manager's claims (`recovery`) and its outcome counters (`recovery_counts`), for
SQLite and PostgreSQL (the transaction-recovery service's design; workers/recovery/).

An entry is a transaction enqueued as a mempool tx (`tx:<txid>`, added with its pending message)
or a half-done multi-record creation the manager found (`creation:<txid>`). A tx entry moves
from `pending` to exactly one terminal status — `confirmed` (mined on the best chain), `deleted`
(conflicting, refused for good, or its record gone after it was made) or `orphan` (not found
after the grace period); a creation entry is removed once its creation is finished.

Invariants:
- A claim selects and leases its rows in one write transaction that locks them (SQLite: BEGIN
  IMMEDIATE; PostgreSQL: FOR UPDATE SKIP LOCKED): of two claims at once, each row goes to one.
  Only pending rows stored longer than the TTL ago whose lease is free or expired are claimed;
  least recently checked first, so every pending row gets its turn.
- A release is taken only from the holder named in the lease (a holder name is unique per
  claim), and only while the row is pending: a holder whose lease expired and was claimed again
  cannot release it, and a terminal row never changes again.
- Every release taken counts its outcome once, in the same transaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stores.sqldb import Database, increasing_key
from stores.state.txbytes import drop_tx_bytes, lock_bytes

KINDS = ("tx", "creation")
PENDING = "pending"
TERMINAL = ("confirmed", "deleted", "orphan")
DONE = "done"  # a creation finished: its row is removed
COLS = "ident, kind, key, status, stored_at, checked_at, holder, lease_until, attempts, accepted, outcome"


def recovery_ddl(dialect: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS recovery (
            seq {increasing_key(dialect)},
            ident TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            status TEXT NOT NULL,
            stored_at BIGINT NOT NULL,
            checked_at BIGINT NOT NULL,
            holder TEXT NOT NULL,
            lease_until BIGINT NOT NULL,
            attempts INTEGER NOT NULL,
            accepted SMALLINT NOT NULL,
            outcome TEXT NOT NULL
        )""",
        # the claim's order among the rows it may take: pending only, least recently checked
        "CREATE INDEX IF NOT EXISTS recovery_due ON recovery (checked_at, seq) WHERE status = 'pending'",
        """CREATE TABLE IF NOT EXISTS recovery_counts (
            kind TEXT NOT NULL, outcome TEXT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (kind, outcome)
        )""",
    ]


@dataclass(frozen=True, slots=True)
class RecoveryEntry:
    ident: str  # "<kind>:<key>"
    kind: str
    key: str  # display hex txid
    status: str  # pending, or one of TERMINAL
    stored_at: float  # seconds since the epoch: added
    checked_at: float  # last released (0: never)
    holder: str  # the claim's holder ("" free)
    lease_until: float  # the claim's expiry (0: free)
    attempts: int  # claims so far
    accepted: bool  # the tx's own task made its record (a later absence is a deletion)
    outcome: str  # the last release's message

    def to_json(self) -> dict[str, Any]:
        return {"ident": self.ident, "status": self.status, "outcome": self.outcome,
                "attempts": self.attempts, "checked_at": self.checked_at}


def _entry(r: Any) -> RecoveryEntry:
    return RecoveryEntry(
        str(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4] / 1000, r[5] / 1000, str(r[6]), r[7] / 1000,
        int(r[8]), bool(r[9]), str(r[10]),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _count_sql(db: Database) -> str:
    """Add n to an outcome's count (kind, outcome, n)."""
    return db.q(
        "INSERT INTO recovery_counts (kind, outcome, n) VALUES (?, ?, ?) "
        "ON CONFLICT (kind, outcome) DO UPDATE SET n = recovery_counts.n + excluded.n"
    )


def insert_sql(db: Database) -> str:
    """Add a pending entry unless its ident is known (whatever its status)."""
    return db.q(
        f"INSERT INTO recovery ({COLS}) VALUES (?, ?, ?, 'pending', ?, 0, '', 0, 0, 0, '') "
        "ON CONFLICT (ident) DO NOTHING"
    )


class RecoveryTable:
    """The recovery methods of SqlStateStore (which provides `db`)."""

    db: Database

    def recovery_add(self, kind: str, keys: Sequence[str]) -> int:
        """Add `kind:key` entries, pending; known idents are left as they are. How many added."""
        if kind not in KINDS:
            raise ValueError(f"recovery kind must be one of {KINDS}, got {kind!r}")
        now, sql = _now_ms(), insert_sql(self.db)

        def unit(cur: Any) -> int:
            added = 0
            for k in keys:
                cur.execute(sql, (f"{kind}:{k}", kind, k, now))
                added += max(cur.rowcount, 0)
            return added

        return self.db.write("add recovery entries", unit, idempotent=True) if keys else 0

    def recovery_claim(
        self, holder: str, lease_s: float, older_than_s: float, limit: int
    ) -> list[RecoveryEntry]:
        """Lease up to `limit` due entries to `holder` (see the module); returned as leased."""
        now = _now_ms()
        until = now + int(lease_s * 1000)
        lock = " FOR UPDATE SKIP LOCKED" if self.db.dialect == "postgresql" else ""
        select = self.db.q(
            f"SELECT {COLS} FROM recovery WHERE status = 'pending' AND stored_at <= ? "
            f"AND lease_until <= ? ORDER BY checked_at, seq LIMIT ?{lock}"
        )
        mark = self.db.q(
            "UPDATE recovery SET holder = ?, lease_until = ?, attempts = attempts + 1 WHERE ident = ?"
        )

        def unit(cur: Any) -> list[Any]:
            cur.execute(select, (now - int(older_than_s * 1000), now, limit))
            rows = [list(r) for r in cur.fetchall()]
            if rows:
                cur.executemany(mark, [(holder, until, r[0]) for r in rows])
            for r in rows:
                r[6], r[7], r[8] = holder, until, r[8] + 1
            return rows

        return [_entry(r) for r in self.db.write("claim recovery entries", unit)]

    def recovery_release(
        self, ident: str, holder: str, outcome: str, status: str = PENDING, accepted: bool = False
    ) -> bool:
        """Free `holder`'s claim with its outcome, moving the entry to `status` (pending: it
        stays; `done`: a finished creation, removed); `accepted`: its record was seen (a later
        absence means it was removed). False when the claim is not `holder`'s any more, or the
        entry is terminal or gone: nothing changed, nothing counted."""
        if status not in (PENDING, DONE, *TERMINAL):
            raise ValueError(f"unknown recovery status {status!r}")
        kind = ident.partition(":")[0]
        now = _now_ms()
        q = self.db.q
        count = _count_sql(self.db)

        def unit(cur: Any) -> bool:
            if status in TERMINAL:  # (first: the bytes may go below; stores/state/txbytes.py)
                lock_bytes(self.db, cur, exclusive=True)
            where = "WHERE ident = ? AND holder = ? AND holder <> '' AND status = 'pending'"
            if status == DONE:
                cur.execute(q(f"DELETE FROM recovery {where}"), (ident, holder))
            else:
                cur.execute(
                    q(f"UPDATE recovery SET status = ?, outcome = ?, checked_at = ?, holder = '', "
                      f"lease_until = 0, accepted = CASE WHEN ? = 1 THEN 1 ELSE accepted END {where}"),
                    (status, outcome, now, int(accepted), ident, holder),
                )
            if cur.rowcount != 1:
                return False
            if status in TERMINAL:  # nobody applies it again: its bytes go (stores/state/txbytes.py)
                drop_tx_bytes(self.db, cur, ident)
            cur.execute(count, (kind, outcome.partition(":")[0], 1))
            return True

        return self.db.write("release a recovery claim", unit)

    def recovery_count(self, kind: str, outcome: str, n: int = 1) -> None:
        """Count `n` outcomes of a manager's step that claims no entry (messages given back or
        re-sent, the chain taken up)."""
        if n <= 0:
            return
        sql = _count_sql(self.db)
        self.db.write("count recovery outcomes", lambda cur: cur.execute(sql, (kind, outcome, n)))

    def recovery_entry(self, ident: str) -> RecoveryEntry | None:
        def q(cur: Any) -> Any:
            cur.execute(self.db.q(f"SELECT {COLS} FROM recovery WHERE ident = ?"), (ident,))
            return cur.fetchone()

        r = self.db.read("recovery entry", q)
        return None if r is None else _entry(r)

    def recovery_summary(self, last: int = 20) -> dict[str, Any]:
        """Entries per kind and status, outcomes counted per kind, and the `last` released."""

        def q(cur: Any) -> dict[str, Any]:
            cur.execute("SELECT kind, status, COUNT(*) FROM recovery GROUP BY kind, status")
            states: dict[str, dict[str, int]] = {}
            for kind, status, n in cur.fetchall():
                states.setdefault(str(kind), {})[str(status)] = int(n)
            cur.execute("SELECT kind, outcome, n FROM recovery_counts ORDER BY kind, outcome")
            outcomes: dict[str, dict[str, int]] = {}
            for kind, outcome, n in cur.fetchall():
                outcomes.setdefault(str(kind), {})[str(outcome)] = int(n)
            cur.execute(
                self.db.q(f"SELECT {COLS} FROM recovery WHERE checked_at > 0 "
                          "ORDER BY checked_at DESC, seq DESC LIMIT ?"),
                (last,),
            )
            recent = [_entry(r).to_json() for r in cur.fetchall()]
            return {"states": states, "outcomes": outcomes, "last": recent}

        return self.db.read("recovery summary", q)
