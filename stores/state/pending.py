"""The state store's table of pending messages (`pending`), for SQLite and PostgreSQL: what has
been enqueued and not yet finished for good, kept where every worker and `utxo wait` can read it
and where a broker restart cannot reach it (workers/runtime/registry.py, workers/recovery/requeue.py).

Invariants:
- One row per message id; adding an id again keeps its row (seq, enqueued time) and only
  records the new send, so the registration order is the order ids were first added.
- A claim selects and marks its rows in one write transaction that locks them (SQLite: BEGIN
  IMMEDIATE; PostgreSQL: FOR UPDATE SKIP LOCKED), so two claims never return the same row unless
  it became due again in between; a row is only ever deleted by `remove_pending`.
- Times are integer milliseconds since the epoch in the table, seconds (float) in PendingEntry.
- A pending message may say why it waits (`pending_waits`: a tx whose parents are not in the
  store yet); that row goes in the same transaction as the message's own, so no finished message
  is ever shown waiting, and one noted again keeps the time it began to wait.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from stores.sqldb import Database, chunks, increasing_key
from stores.state.protocol import PENDING_KINDS, PendingDone, PendingEntry
from stores.state.recovery import insert_sql
from stores.state.refusals import forget_refusal, note_refusal
from stores.state.txbytes import keep_tx_bytes, lock_bytes

COLS = "ident, kind, key, seq, enqueued_at, sent_at, broker_run, sends"
IN_CHUNK = 500  # ids per `IN (…)` list: well below either database's parameter limit


def pending_ddl(dialect: str) -> list[str]:
    # seq is the row's own increasing id, so ordering by it is the registration order
    return [
        f"""CREATE TABLE IF NOT EXISTS pending (
            seq {increasing_key(dialect)},
            ident TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            enqueued_at BIGINT NOT NULL,
            sent_at BIGINT NOT NULL,
            broker_run TEXT NOT NULL,
            sends INTEGER NOT NULL
        )""",
        # why a pending message waits, where it says (a tx's missing parents): a table apart
        # from `pending`, so a state store made before it needs nothing but this CREATE
        """CREATE TABLE IF NOT EXISTS pending_waits (
            ident TEXT PRIMARY KEY,
            reason TEXT NOT NULL,
            since BIGINT NOT NULL
        )""",
    ]


def _entry(r: Any) -> PendingEntry:
    return PendingEntry(
        str(r[0]), str(r[1]), str(r[2]), int(r[3]), r[4] / 1000, r[5] / 1000, str(r[6]), int(r[7])
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class PendingTable:
    """The pending-message methods of SqlStateStore (which provides `db`)."""

    db: Database

    def add_pending(self, ident: str, kind: str, key: str, broker_run: str) -> None:
        self.add_pending_many([(ident, kind, key)], broker_run)

    def add_pending_many(
        self, entries: Sequence[tuple[str, str, str]], broker_run: str,
        kept: Mapping[str, bytes] | None = None,
    ) -> None:
        for _ident, kind, _key in entries:
            if kind not in PENDING_KINDS:
                raise ValueError(f"pending kind must be one of {PENDING_KINDS}, got {kind!r}")
        now = _now_ms()
        sql = self.db.q(
            f"INSERT INTO pending ({COLS.replace('seq, ', '')}) VALUES (?, ?, ?, ?, ?, ?, 1) "
            "ON CONFLICT (ident) DO UPDATE SET sent_at = excluded.sent_at, "
            "broker_run = excluded.broker_run, sends = pending.sends + 1"
        )
        recover = insert_sql(self.db)

        def unit(cur: Any) -> None:
            if kept:  # (first: no deletion of bytes may miss this registration; txbytes.py)
                lock_bytes(self.db, cur, exclusive=False)
            cur.executemany(sql, [(ident, kind, key, now, now, broker_run) for ident, kind, key in entries])
            # a mempool tx is followed until it is mined (workers/recovery)
            txs = [(ident, kind, key, now) for ident, kind, key in entries if kind == "tx"]
            if txs:
                cur.executemany(recover, txs)
            keep_tx_bytes(self.db, cur, kept or {})  # (stores/state/txbytes.py)

        # upserts: a connection lost in its COMMIT is tried again too (at worst a send counted twice)
        self.db.write("add pending", unit, idempotent=True)

    def remove_pending(
        self, ident: str, accepted: bool = False, refused: tuple[str, str | None] | None = None
    ) -> None:
        self.remove_pending_many([PendingDone(ident, accepted, refused)])

    def remove_pending_many(self, done: Sequence[PendingDone]) -> None:
        sql = self.db.q("DELETE FROM pending WHERE ident = ?")
        unwait = self.db.q("DELETE FROM pending_waits WHERE ident = ?")
        note = self.db.q("UPDATE recovery SET accepted = 1 WHERE ident = ?")

        def unit(cur: Any) -> None:
            cur.executemany(sql, [(d.ident,) for d in done])
            cur.executemany(unwait, [(d.ident,) for d in done])
            accepted = [(d.ident,) for d in done if d.accepted]
            if accepted:
                cur.executemany(note, accepted)
            for d in done:
                if d.accepted:
                    forget_refusal(self.db, cur, d.ident)
                elif d.refused is not None:
                    kind, _, key = d.ident.partition(":")
                    note_refusal(self.db, cur, d.ident, kind, key, *d.refused)

        # deletes, a flag set and a refusal replaced: running it twice is running it once, so a
        # connection lost in its COMMIT is tried again (a `utxo wait` settling blocks meets that)
        self.db.write("remove pending", unit, idempotent=True)

    def note_waiting(self, reasons: Sequence[tuple[str, str]]) -> None:
        now = _now_ms()
        # FOR SHARE (PostgreSQL): a message being finished meanwhile is waited for, then found
        # gone, so no reason outlives its message (its remover's DELETE could not see this row)
        share = " FOR SHARE" if self.db.dialect == "postgresql" else ""
        sql = self.db.q(
            "INSERT INTO pending_waits (ident, reason, since) SELECT ?, ?, ? "
            f"WHERE EXISTS (SELECT 1 FROM pending WHERE ident = ?{share}) "
            "ON CONFLICT (ident) DO UPDATE SET reason = excluded.reason"
        )

        def unit(cur: Any) -> None:
            cur.executemany(sql, [(ident, reason, now, ident) for ident, reason in reasons])

        if reasons:  # an upsert: a connection lost in its COMMIT is tried again
            self.db.write("note waiting", unit, idempotent=True)

    def sweep_waits(self) -> int:
        """See the protocol (StateStore.sweep_waits)."""

        def unit(cur: Any) -> int:
            cur.execute("DELETE FROM pending_waits WHERE NOT EXISTS "
                        "(SELECT 1 FROM pending WHERE pending.ident = pending_waits.ident)")
            return int(cur.rowcount or 0)

        return self.db.write("sweep waits", unit, idempotent=True)

    def waiting(
        self, idents: Sequence[str] | None = None, limit: int = 20
    ) -> tuple[int, dict[str, tuple[str, float]]]:
        """See the protocol (StateStore.waiting)."""

        def q(cur: Any) -> tuple[int, list[Any]]:
            if idents is None:
                cur.execute("SELECT COUNT(*) FROM pending_waits")
                n = int(cur.fetchone()[0])
                cur.execute(self.db.q(f"SELECT ident, reason, since FROM pending_waits "
                                      f"ORDER BY since LIMIT {int(limit)}"))
                return n, list(cur.fetchall())
            rows: list[Any] = []
            for part in chunks(idents, IN_CHUNK):
                cur.execute(self.db.q(f"SELECT ident, reason, since FROM pending_waits WHERE ident IN "
                                      f"({', '.join('?' * len(part))})"), tuple(part))
                rows += cur.fetchall()
            return len(rows), sorted(rows, key=lambda r: r[2])[:limit]

        n, rows = self.db.read("pending waits", q)
        return n, {str(i): (str(r), s / 1000) for i, r, s in rows}

    def pending_counts(self) -> dict[str, int]:
        """Messages pending per kind (`utxo status`, `utxo metrics`: a count, not the rows)."""

        def q(cur: Any) -> dict[str, int]:
            cur.execute("SELECT kind, COUNT(*) FROM pending GROUP BY kind")
            return {str(k): int(n) for k, n in cur.fetchall()}

        return self.db.read("pending counts", q)

    def pending(
        self, upto: int | None = None, *, kind: str | None = None, sent_before: float | None = None,
        limit: int | None = None,
    ) -> list[PendingEntry]:
        where, params = [], []
        for clause, value in (("seq <= ?", upto), ("kind = ?", kind),
                              ("sent_at < ?", None if sent_before is None else int(sent_before * 1000))):
            if value is not None:
                where.append(clause)
                params.append(value)
        sql = f"SELECT {COLS} FROM pending{' WHERE ' + ' AND '.join(where) if where else ''} ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"

        def q(cur: Any) -> list[Any]:
            cur.execute(self.db.q(sql), params)
            return list(cur.fetchall())

        return [_entry(r) for r in self.db.read("pending", q)]

    def claim_pending(
        self, broker_run: str | None, older_than_s: float, limit: int, after: int = 0
    ) -> list[PendingEntry]:
        now = _now_ms()
        due: list[Any] = [after, now - int(older_than_s * 1000)]
        where = "seq > ? AND (sent_at < ?"
        if broker_run is not None:
            where += " OR broker_run <> ?"
            due.append(broker_run)
        where += ")"
        # SKIP LOCKED: a second claim running at the same time passes over the rows the first
        # holds instead of waiting for them and then finding them no longer due.
        lock = " FOR UPDATE SKIP LOCKED" if self.db.dialect == "postgresql" else ""
        select = self.db.q(f"SELECT {COLS} FROM pending WHERE {where} ORDER BY seq LIMIT ?{lock}")
        mark = self.db.q("UPDATE pending SET sent_at = ?, broker_run = ?, sends = sends + 1 WHERE seq = ?")

        def unit(cur: Any) -> list[Any]:
            cur.execute(select, (*due, limit))
            rows = list(cur.fetchall())
            if rows:
                cur.executemany(mark, [(now, broker_run or "", r[3]) for r in rows])
            return rows

        return [_entry(r) for r in self.db.write("claim pending", unit)]

    def unclaim_pending(self, idents: list[str]) -> None:
        # due at the next claim whatever its broker run or age: sent time 0, run unknown; the
        # count the claim added is taken back, as the message was not sent
        def unit(cur: Any) -> None:
            for part in chunks(idents, IN_CHUNK):
                marks = ", ".join("?" * len(part))
                cur.execute(
                    self.db.q(
                        "UPDATE pending SET sent_at = 0, broker_run = '', "
                        "sends = CASE WHEN sends > 0 THEN sends - 1 ELSE 0 END "
                        f"WHERE ident IN ({marks})"
                    ),
                    tuple(part),
                )

        if idents:
            self.db.write("unclaim pending", unit)
