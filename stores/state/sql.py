"""The state store on SQLite or PostgreSQL: tables `blocks`, `chain` (the tip), `undo`, `leases`,
`pending` (the registry of pending messages: stores/state/pending.py), `prune_jobs` (the
pruner's jobs: stores/state/prunejobs.py), `recovery` (the recovery manager's claims:
stores/state/recovery.py) and `refusals` (refused transactions: stores/state/refusals.py).

Cumulative work is kept as 64 hex digits, zero-padded, so that ordering the text orders the
numbers on both databases (work can exceed any integer column).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from stores.errors import StorageError
from stores.lease import lapsed
from stores.sqldb import Database
from stores.state.chunks import ChunkBoardMixin, chunk_ddl
from stores.state.pending import PendingTable, pending_ddl
from stores.state.protocol import KEEP, BlockChange, BlockEntry, BlockStatus, Commitment, PreparedDelta
from stores.state.prunejobs import PruneJobs, prune_ddl
from stores.state.recovery import RecoveryTable, recovery_ddl
from stores.state.refusals import RefusalLog, refusals_ddl
from stores.state.sessionlock import AdvisoryLock
from stores.state.txbytes import TxBytes, txbytes_ddl

log = logging.getLogger("utxoflow.state")

SCHEMA = "utxoflow-state-1"
COLS = "hash, parent, height, work, status, reason, block_id, seq, n_txs"


def _ddl(blob: str, bigint: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS blocks (
            hash {blob} PRIMARY KEY,
            parent {blob} NOT NULL,
            height INTEGER,
            work TEXT,
            status TEXT NOT NULL,
            reason TEXT,
            block_id {bigint} NOT NULL UNIQUE,
            seq {bigint} NOT NULL UNIQUE,
            n_txs INTEGER NOT NULL,
            received_at {bigint} NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS blocks_parent ON blocks (parent)",
        # `block_summary` (every scrape of `utxo metrics`, every `utxo status`): an index-only
        # count; a scan of the table took 0.45 s at 900,000 blocks on SQLite, this 0.1 s
        "CREATE INDEX IF NOT EXISTS blocks_status ON blocks (status, height)",
        "CREATE INDEX IF NOT EXISTS blocks_best ON blocks (work, seq) "
        "WHERE status IN ('pending', 'applied', 'side')",
        "CREATE TABLE IF NOT EXISTS chain (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS undo (hash {blob} PRIMARY KEY, data TEXT NOT NULL)",
        # a block's UTXO-set commitment (a store made before them gains the table: the schema
        # version stays, and `workers.chainstate.commitment` computes a missing one from the UTXO store)
        f"""CREATE TABLE IF NOT EXISTS commitments (
            hash {blob} PRIMARY KEY, muhash {blob} NOT NULL, utxos {bigint} NOT NULL,
            satoshis {bigint} NOT NULL
        )""",
        # a block's commitment delta prepared ahead of the chain (`workers.chainstate.prepare`; a store made
        # before them gains the table)
        f"""CREATE TABLE IF NOT EXISTS deltas (
            hash {blob} PRIMARY KEY, basis TEXT NOT NULL, muhash {blob} NOT NULL,
            utxos {bigint} NOT NULL, satoshis {bigint} NOT NULL
        )""",
        f"""CREATE TABLE IF NOT EXISTS leases (
            name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at {bigint} NOT NULL
        )""",
        *chunk_ddl(blob, bigint),
    ]


def state_ddl(dialect: str, blob: str, bigint: str) -> list[str]:
    """Every statement that makes a state store's tables and indexes (IF NOT EXISTS)."""
    extra = pending_ddl(dialect) + prune_ddl(dialect) + recovery_ddl(dialect) + refusals_ddl(dialect)
    return _ddl(blob, bigint) + extra + txbytes_ddl(blob)


def state_tables() -> list[str]:
    """The names of a state store's tables (a test database drops them between tests)."""
    statements = state_ddl("sqlite", "BLOB", "INTEGER")
    made = (re.match(r"\s*CREATE TABLE IF NOT EXISTS (\w+)", s) for s in statements)
    return [m.group(1) for m in made if m]


def _work(w: int | None) -> str | None:
    if w is None:
        return None
    if not 0 <= w < 1 << 256:
        raise ValueError(f"cumulative work {w} is outside 0…2^256-1")
    return f"{w:064x}"


def _entry(r: Any) -> BlockEntry:
    return BlockEntry(
        bytes(r[0]), bytes(r[1]), r[2], None if r[3] is None else int(r[3], 16), BlockStatus(r[4]),
        r[5], r[6], r[7], r[8],
    )


class SqlStateStore(ChunkBoardMixin, PendingTable, PruneJobs, RecoveryTable, RefusalLog, TxBytes):
    def __init__(self, url: str, *, create: bool = True) -> None:
        self.url = url
        self._create = create
        self.db = Database(url, what="state store", create=create)
        try:
            self.db.write("create the state schema", self._schema, idempotent=True)  # IF NOT EXISTS
        except BaseException:
            self.db.close()  # a refused store leaves no connection behind
            raise

    def _schema(self, cur: Any) -> None:
        if self.db.dialect == "postgresql":
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (0x53544154,))  # "STAT": DDL one at a time
        if not self._create:  # a URL that holds no state store is refused, not given one
            cur.execute(
                "SELECT to_regclass('chain') IS NOT NULL" if self.db.dialect == "postgresql" else
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chain')"
            )
            if not cur.fetchone()[0]:
                raise StorageError(f"no state store at {self.db.url_safe}")
        # a store made before `pending` existed gains the table here: nothing else changed, so the
        # schema version stays
        for stmt in state_ddl(self.db.dialect, self.db.blob, self.db.bigint):
            cur.execute(stmt)
        cur.execute(self.db.q("SELECT value FROM chain WHERE key = 'schema'"))
        r = cur.fetchone()
        if r is None:
            cur.execute(self.db.q("INSERT INTO chain (key, value) VALUES ('schema', ?)"), (SCHEMA,))
        elif r[0] != SCHEMA:
            raise StorageError(
                f"{self.db.url_safe} holds a state store of schema {r[0]!r}; this version needs {SCHEMA!r}"
            )

    def session_lock(self, lock_id: int) -> AdvisoryLock | None:
        """A lock held while a session of its own lives (stores/state/sessionlock.py):
        PostgreSQL's advisory lock; None on SQLite."""
        if self.db.dialect != "postgresql":
            return None
        return AdvisoryLock(self.url.replace("postgresql+psycopg://", "postgresql://", 1), lock_id)

    # -- blocks ------------------------------------------------------------------------------
    def add_block(
        self, hash: bytes, parent: bytes, height: int | None, work: int | None, status: BlockStatus,
        n_txs: int, reason: str | None = None,
    ) -> BlockEntry:
        q = self.db.q

        def unit(cur: Any) -> Any:
            if self.db.dialect == "postgresql":  # adds one at a time (SQLite: BEGIN IMMEDIATE), so a
                # racing add of the same hash finds the first one and MAX(seq) + 1 stays unique
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (0x53544142,))  # "STAB"
            cur.execute(q(f"SELECT {COLS} FROM blocks WHERE hash = ?"), (hash,))
            r = cur.fetchone()
            if r is not None:
                return r
            cur.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM blocks")
            seq = int(cur.fetchone()[0])
            now = int(time.time() * 1000)
            row = (hash, parent, height, _work(work), status.value, reason, seq, seq, n_txs, now)
            cur.execute(
                q(f"INSERT INTO blocks ({COLS}, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"), row
            )
            return row[:9]

        return _entry(self.db.write("add block", unit))

    def get_block(self, hash: bytes) -> BlockEntry | None:
        def q(cur: Any) -> Any:
            cur.execute(self.db.q(f"SELECT {COLS} FROM blocks WHERE hash = ?"), (hash,))
            return cur.fetchone()

        r = self.db.read("get block", q)
        return None if r is None else _entry(r)

    def update_block(
        self, hash: bytes, *, status: BlockStatus | None = None, reason: str | None = None,
        height: int | None = None, work: int | None = None,
    ) -> None:
        self.db.write("update block", lambda cur: self._update_block(cur, hash, status, reason, height, work))

    def _update_block(
        self, cur: Any, hash: bytes, status: BlockStatus | None, reason: str | None, height: int | None,
        work: int | None,
    ) -> None:
        sets: list[str] = []
        vals: list[Any] = []
        for col, v in (("status", status and status.value), ("reason", reason), ("height", height),
                       ("work", _work(work))):
            if v is not None:
                sets.append(f"{col} = ?")
                vals.append(v)
        if not sets:
            return
        cur.execute(self.db.q(f"UPDATE blocks SET {', '.join(sets)} WHERE hash = ?"), (*vals, hash))
        if cur.rowcount != 1:
            raise StorageError(f"block {hash[::-1].hex()} is not in the state store")

    def children(self, parent: bytes) -> list[BlockEntry]:
        def q(cur: Any) -> list[Any]:
            cur.execute(self.db.q(f"SELECT {COLS} FROM blocks WHERE parent = ? ORDER BY seq"), (parent,))
            return list(cur.fetchall())

        return [_entry(r) for r in self.db.read("children", q)]

    def best_candidate(self) -> BlockEntry | None:
        def q(cur: Any) -> Any:
            cur.execute(
                f"SELECT {COLS} FROM blocks WHERE status IN ('pending', 'applied', 'side') "
                "AND work IS NOT NULL ORDER BY work DESC, seq ASC LIMIT 1"
            )
            return cur.fetchone()

        r = self.db.read("best candidate", q)
        return None if r is None else _entry(r)

    def tip(self) -> BlockEntry | None:
        def q(cur: Any) -> Any:
            cur.execute("SELECT value FROM chain WHERE key = 'tip'")
            r = cur.fetchone()
            if r is None:
                return None
            cur.execute(self.db.q(f"SELECT {COLS} FROM blocks WHERE hash = ?"), (bytes.fromhex(r[0]),))
            return cur.fetchone()

        r = self.db.read("tip", q)
        return None if r is None else _entry(r)

    def set_tip(self, hash: bytes | None) -> None:
        self.db.write("set tip", lambda cur: self._set_tip(cur, hash), idempotent=True)

    def _set_tip(self, cur: Any, hash: bytes | None) -> None:
        cur.execute(self.db.q("DELETE FROM chain WHERE key = 'tip'"))
        if hash is not None:
            cur.execute(self.db.q("INSERT INTO chain (key, value) VALUES ('tip', ?)"), (hash.hex(),))

    def get_meta(self, key: str) -> str | None:
        def q(cur: Any) -> Any:
            cur.execute(self.db.q("SELECT value FROM chain WHERE key = ?"), (f"meta:{key}",))
            return cur.fetchone()

        r = self.db.read("get meta", q)
        return None if r is None else str(r[0])

    def set_meta(self, key: str, value: str | None) -> None:
        self.db.write("set meta", lambda cur: self._set_meta(cur, key, value), idempotent=True)

    def _set_meta(self, cur: Any, key: str, value: str | None) -> None:
        cur.execute(self.db.q("DELETE FROM chain WHERE key = ?"), (f"meta:{key}",))
        if value is not None:
            cur.execute(self.db.q("INSERT INTO chain (key, value) VALUES (?, ?)"), (f"meta:{key}", value))

    def is_empty(self) -> bool:
        def q(cur: Any) -> bool:
            cur.execute("SELECT 1 FROM blocks LIMIT 1")
            return cur.fetchone() is None

        return self.db.read("is_empty", q)

    def counts(self) -> dict[str, int]:
        def q(cur: Any) -> dict[str, int]:
            cur.execute("SELECT status, COUNT(*) FROM blocks GROUP BY status")
            return {r[0]: int(r[1]) for r in cur.fetchall()}

        return self.db.read("counts", q)

    def block_summary(self) -> dict[str, tuple[int, int | None]]:
        """Blocks per status, with the highest height among them (orphans have none): the
        best known height is the highest of a connected block, whatever the tip."""

        def q(cur: Any) -> dict[str, tuple[int, int | None]]:
            cur.execute("SELECT status, COUNT(*), MAX(height) FROM blocks GROUP BY status")
            return {str(r[0]): (int(r[1]), None if r[2] is None else int(r[2])) for r in cur.fetchall()}

        return self.db.read("block summary", q)

    def last_blocks(self, status: BlockStatus, limit: int = 10) -> list[BlockEntry]:
        def q(cur: Any) -> list[Any]:
            sql = f"SELECT {COLS} FROM blocks WHERE status = ? ORDER BY seq DESC LIMIT ?"
            cur.execute(self.db.q(sql), (status.value, limit))
            return list(cur.fetchall())

        return [_entry(r) for r in self.db.read("last blocks", q)]

    def commit(
        self,
        *,
        blocks: Sequence[BlockChange] = (),
        tip: bytes | None = KEEP,
        undo: Mapping[bytes, dict[str, Any] | None] = {},
        meta: Mapping[str, str | None] = {},
        prune_undo_below: int | None = None,
        commitments: Mapping[bytes, Commitment] = {},
        deltas: Mapping[bytes, PreparedDelta | None] = {},
    ) -> None:
        q = self.db.q

        def unit(cur: Any) -> None:
            for b in blocks:
                self._update_block(cur, b.hash, b.status, b.reason, b.height, b.work)
            if tip is not KEEP:
                self._set_tip(cur, tip)
            for h, data in undo.items():
                cur.execute(q("DELETE FROM undo WHERE hash = ?"), (h,))
                if data is not None:
                    cur.execute(q("INSERT INTO undo (hash, data) VALUES (?, ?)"),
                                (h, json.dumps(data, separators=(",", ":"))))
            for key, value in meta.items():
                self._set_meta(cur, key, value)
            if prune_undo_below is not None:
                cur.execute(q("DELETE FROM undo WHERE hash IN (SELECT hash FROM blocks "
                              "WHERE status = 'applied' AND height <= ?)"), (prune_undo_below,))
                # prepared deltas of any block down there: none will be applied (a reorg that
                # deep is refused), whether it is applied, a side branch's or refused
                cur.execute(q("DELETE FROM deltas WHERE hash IN (SELECT hash FROM blocks WHERE height <= ?)"),
                            (prune_undo_below,))
            if commitments:  # (an upsert: two writers of one block's value never collide)
                cur.executemany(
                    q("INSERT INTO commitments (hash, muhash, utxos, satoshis) VALUES (?, ?, ?, ?) "
                      "ON CONFLICT (hash) DO UPDATE SET muhash = excluded.muhash, utxos = excluded.utxos, "
                      "satoshis = excluded.satoshis"),
                    [(h, c.muhash, c.utxos, c.satoshis) for h, c in commitments.items()],
                )
            gone = [(h,) for h, d in deltas.items() if d is None]
            if gone:
                cur.executemany(q("DELETE FROM deltas WHERE hash = ?"), gone)
            made = [(h, d.basis, d.muhash, d.utxos, d.satoshis) for h, d in deltas.items() if d is not None]
            if made:
                cur.executemany(
                    q("INSERT INTO deltas (hash, basis, muhash, utxos, satoshis) VALUES (?, ?, ?, ?, ?) "
                      "ON CONFLICT (hash) DO UPDATE SET basis = excluded.basis, muhash = excluded.muhash, "
                      "utxos = excluded.utxos, satoshis = excluded.satoshis"),
                    made,
                )

        self.db.write("commit chain state", unit)

    def get_commitment(self, hash: bytes) -> Commitment | None:
        def q(cur: Any) -> Any:
            cur.execute(self.db.q("SELECT muhash, utxos, satoshis FROM commitments WHERE hash = ?"), (hash,))
            return cur.fetchone()

        r = self.db.read("get commitment", q)
        return None if r is None else Commitment(bytes(r[0]), int(r[1]), int(r[2]))

    def get_delta(self, hash: bytes) -> PreparedDelta | None:
        def q(cur: Any) -> Any:
            sql = "SELECT basis, muhash, utxos, satoshis FROM deltas WHERE hash = ?"
            cur.execute(self.db.q(sql), (hash,))
            return cur.fetchone()

        r = self.db.read("get prepared delta", q)
        return None if r is None else PreparedDelta(r[0], bytes(r[1]), int(r[2]), int(r[3]))

    def demote_pending(self, work: int) -> int:
        def unit(cur: Any) -> int:
            cur.execute(self.db.q("UPDATE blocks SET status = 'side' WHERE status = 'pending' AND work <= ?"),
                        (_work(work),))
            return int(cur.rowcount)

        return self.db.write("demote pending blocks", unit)

    # -- undo records ------------------------------------------------------------------------
    def put_undo(self, hash: bytes, data: dict[str, Any]) -> None:
        text = json.dumps(data, separators=(",", ":"))

        def unit(cur: Any) -> None:
            cur.execute(
                self.db.q(
                    "INSERT INTO undo (hash, data) VALUES (?, ?) ON CONFLICT (hash) DO UPDATE SET data = ?"
                ),
                (hash, text, text),
            )

        self.db.write("put undo", unit)

    def get_undo(self, hash: bytes) -> dict[str, Any] | None:
        def q(cur: Any) -> Any:
            cur.execute(self.db.q("SELECT data FROM undo WHERE hash = ?"), (hash,))
            return cur.fetchone()

        r = self.db.read("get undo", q)
        return None if r is None else dict(json.loads(r[0]))

    def delete_undo(self, hash: bytes) -> None:
        self.db.write(
            "delete undo", lambda cur: cur.execute(self.db.q("DELETE FROM undo WHERE hash = ?"), (hash,))
        )

    # -- leases ------------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        now = int(time.time() * 1000)

        def unit(cur: Any) -> bool:
            q = self.db.q
            sql = f"SELECT holder, expires_at FROM leases WHERE name = ?{self.db.for_update}"
            cur.execute(q(sql), (name,))
            held = cur.fetchone()
            if held is not None and (held[0] == holder or lapsed(held[0], held[1], now)):
                if held[0] != holder and held[1] > now:
                    log.warning("taking over the %s lease of %s, a process that is gone", name, held[0])
                cur.execute(q("DELETE FROM leases WHERE name = ? AND holder = ?"), (name, held[0]))
            cur.execute(
                q(
                    "INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (name) DO NOTHING"
                ),
                (name, holder, now + int(ttl_s * 1000)),
            )
            return bool(cur.rowcount == 1)

        return self.db.write("acquire lease", unit)

    def lease_holder(self, name: str) -> str | None:
        """Who holds the lease `name` now (None: nobody, or an expired holder)."""
        now = int(time.time() * 1000)

        def q(cur: Any) -> Any:
            cur.execute(self.db.q("SELECT holder FROM leases WHERE name = ? AND expires_at > ?"), (name, now))
            return cur.fetchone()

        r = self.db.read("lease holder", q)
        return None if r is None else str(r[0])

    def release_lease(self, name: str, holder: str) -> None:
        self.db.write(
            "release lease",
            lambda cur: cur.execute(
                self.db.q("DELETE FROM leases WHERE name = ? AND holder = ?"), (name, holder)
            ),
        )

    def close(self) -> None:
        self.db.close()
