"""Lock records of two-phase creation (Teranode's lock-record pattern; docs/architecture.md, "Big
transactions").

Invariants:
- At most one live lock per txid: acquiring inserts create-only, so of racing creators exactly
  one gets it; the others learn who holds it.
- A lock lives 30 s + 2 s per record, at most 300 s (the settings' UTXO_LOCK_* values), then
  lapses: the next acquirer removes an expired lock in the same unit that inserts its own, so a
  creator that died never blocks the transaction for longer than its TTL.
- Release removes only the caller's own lock (same holder and creation time), so a creator
  whose lock lapsed and was taken over cannot release its successor's.
- A lock whose holder is a process of this host that no longer runs is taken over at once,
  without waiting for its TTL (`stores.lease`: a holder on another host can only be waited
  out). Taking over is safe even if that judgement were wrong: the lock only saves duplicate
  work, because pages are create-only and identical whoever writes them (`stores.utxo.twophase`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from stores.lease import lapsed
from stores.utxo import validate
from stores.utxo.sql.scriptindex import ScriptIndexMixin
from stores.utxo.values import LOCK_TYPE, CreationLock


class LockMixin(ScriptIndexMixin):
    lock_base_ttl = 30.0
    lock_per_record_ttl = 2.0
    lock_max_ttl = 300.0

    def lock_ttl(self, records: int) -> float:
        """Seconds a creation lock for this many records lives."""
        return min(self.lock_base_ttl + self.lock_per_record_ttl * records, self.lock_max_ttl)

    def acquire_creation_lock(
        self, txid: bytes, expected_recs: int, options: dict[str, Any] | None = None
    ) -> CreationLock | None:
        """Take the lock for creating `txid`; None when someone else holds a live one.
        `options` (JSON) records how the creator was asked to create the transaction, so that
        a recovery that finds only its blob rebuilds exactly that (`creation_options`)."""
        validate.hash32("txid", txid)
        validate.number("expected_recs", expected_recs)
        now = int(time.time() * 1000)
        lock = CreationLock(
            txid,
            now,
            now + int(self.lock_ttl(expected_recs) * 1000),
            os.getpid(),
            socket.gethostname(),
            expected_recs,
        )

        def unit(cur: Any) -> bool:
            q = self.db.q
            cur.execute(
                q(
                    "SELECT created_at, process_id, hostname, expires_at FROM tx_locks "
                    f"WHERE txid = ?{self.db.for_update}"
                ),
                (txid,),
            )
            held = cur.fetchone()
            if held is not None and lapsed(f"{held[2]}:{held[1]}", held[3], now):
                cur.execute(
                    q("DELETE FROM tx_locks WHERE txid = ? AND created_at = ? AND process_id = ?"),
                    (txid, held[0], held[1]),
                )
            cur.execute(
                self.db.q(
                    "INSERT INTO tx_locks (txid, lock_type, created_at, expires_at, process_id, hostname, "
                    "expected_recs, options) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (txid) DO NOTHING"
                ),
                (
                    txid,
                    LOCK_TYPE,
                    lock.created_at,
                    lock.expires_at,
                    lock.process_id,
                    lock.hostname,
                    expected_recs,
                    json.dumps(options or {}, separators=(",", ":")),
                ),
            )
            return bool(cur.rowcount == 1)

        return lock if self.db.write("acquire_creation_lock", unit) else None

    def release_creation_lock(self, lock: CreationLock) -> bool:
        """Remove this holder's lock; False when it had lapsed and is gone or taken over."""

        def unit(cur: Any) -> bool:
            cur.execute(
                self.db.q(
                    "DELETE FROM tx_locks WHERE txid = ? AND created_at = ? AND process_id = ? "
                    "AND hostname = ?"
                ),
                (lock.txid, lock.created_at, lock.process_id, lock.hostname),
            )
            return bool(cur.rowcount == 1)

        return self.db.write("release_creation_lock", unit)

    def creation_options(self, txid: bytes) -> dict[str, Any] | None:
        """The options of the last creator that locked `txid`, live or lapsed (a dead creator's
        lock row stays until someone takes the lock over); None when there is no lock row."""
        validate.hash32("txid", txid)

        def q(cur: Any) -> Any:
            cur.execute(self.db.q("SELECT options FROM tx_locks WHERE txid = ?"), (txid,))
            return cur.fetchone()

        r = self.db.read("creation_options", q)
        return None if r is None else dict(json.loads(r[0]))

    def half_done_creations(self, limit: int = 1000) -> list[bytes]:
        """Txids whose creation a dead creator left half done (see the Protocol)."""
        validate.number("limit", limit)
        now = int(time.time() * 1000)

        def q(cur: Any) -> list[bytes]:
            cur.execute(
                self.db.q(
                    "SELECT t.txid FROM txs t WHERE t.creating = 1 AND NOT EXISTS "
                    "(SELECT 1 FROM tx_locks l WHERE l.txid = t.txid AND l.expires_at > ?) "
                    "UNION SELECT l.txid FROM tx_locks l WHERE l.expires_at <= ? AND NOT EXISTS "
                    "(SELECT 1 FROM txs t WHERE t.txid = l.txid) LIMIT ?"
                ),
                (now, now, limit),
            )
            return [bytes(r[0]) for r in cur.fetchall()]

        return sorted(self.db.read("half_done_creations", q))

    def get_creation_lock(self, txid: bytes) -> CreationLock | None:
        """The live lock on `txid`, for inspection; an expired one counts as none."""
        validate.hash32("txid", txid)
        now = int(time.time() * 1000)

        def q(cur: Any) -> Any:
            cur.execute(
                self.db.q(
                    "SELECT created_at, expires_at, process_id, hostname, expected_recs FROM tx_locks "
                    "WHERE txid = ? AND expires_at > ?"
                ),
                (txid, now),
            )
            return cur.fetchone()

        r = self.db.read("get_creation_lock", q)
        return None if r is None else CreationLock(txid, r[0], r[1], r[2], r[3], r[4])
