"""SQLite backend (`sqlite:///PATH`, the embedded default).

Invariants:
- WAL journal, so readers never block the writer; every write unit starts with BEGIN IMMEDIATE,
  which takes the database's single write lock up front — the read-decide-write of a unit can
  therefore never interleave with another process's, and two processes spending one output
  cannot both win.
- One connection per store object, guarded by a lock, so a store may be shared by threads.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stores.utxo.errors import StorageError
from stores.utxo.sql.base import Row
from stores.utxo.sql.schema import ddl
from stores.utxo.sql.store import SqlUtxoStore

PREFIX = "sqlite:///"


def sqlite_path(url: str) -> str:
    """`sqlite:///rel/path`, `sqlite:////abs/path` or `sqlite:///:memory:` → the file path."""
    if not url.startswith(PREFIX):
        raise ValueError(f"not a sqlite URL (expected {PREFIX}PATH): {url}")
    path = url[len(PREFIX) :].split("?", 1)[0]
    if not path:
        raise ValueError(f"sqlite URL has no path: {url}")
    return path


class SqliteUtxoStore(SqlUtxoStore):
    def __init__(self, url: str, **opts: Any) -> None:
        super().__init__(url, **opts)
        path = sqlite_path(url)
        if path != ":memory:" and not self.may_create and not Path(path).is_file():
            raise StorageError(f"no UTXO store at {path}")
        if path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StorageError(f"cannot create the directory of SQLite store {path}: {e}") from e
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(
                path,
                isolation_level=None,
                timeout=60.0,
                check_same_thread=False,
                cached_statements=256,
            )
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() not in ("wal", "memory"):
                raise StorageError(f"SQLite store {path} cannot use WAL journaling (got {mode!r})")
            for pragma in (
                "PRAGMA synchronous=NORMAL",
                "PRAGMA busy_timeout=60000",
                "PRAGMA cache_size=-131072",
                "PRAGMA temp_store=MEMORY",
                # Checkpoint the WAL every 64 MB rather than every 4 MB: a block's writes then
                # reach the main file in a few large sequential passes, not many small ones.
                "PRAGMA wal_autocheckpoint=16384",
                "PRAGMA journal_size_limit=67108864",
            ):
                self._conn.execute(pragma)
            self._run_write("create schema", self._schema)
        except sqlite3.Error as e:
            raise StorageError(f"cannot open SQLite store {path}: {e}") from e
        except StorageError:
            self._conn.close()
            raise
        self.block_height = self._load_block_height()

    def _schema(self, cur: Any) -> None:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'txs'")
        existed = cur.fetchone() is not None
        if not existed and not self.may_create:
            raise StorageError(f"no UTXO store at {sqlite_path(self.url)} (the file holds no store)")
        # INTEGER PRIMARY KEY is SQLite's rowid: new records append to the table.
        for stmt in ddl("BLOB", "INTEGER"):
            cur.execute(stmt)
        self._check_schema_version(cur, existed)

    def _reserve_ids(self, cur: Any, n: int) -> list[int]:
        # Safe without a sequence: the write unit holds the database's only write lock.
        cur.execute("SELECT COALESCE(MAX(id), 0) FROM txs")
        start = int(cur.fetchone()[0]) + 1
        return list(range(start, start + n))

    @contextmanager
    def _write_txn(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                # Also after a failed COMMIT; SQLite may have rolled back already on its own.
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            finally:
                cur.close()

    @contextmanager
    def _read_cursor(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN")
            try:
                yield cur
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")
                cur.close()

    def _is_transient(self, exc: BaseException) -> bool:
        msg = str(exc).lower()
        return isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg)

    def _db_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def _q(self, sql: str) -> str:
        return sql

    def _select_txs(self, cur: Any, cols: str, txids: Sequence[bytes], lock: bool) -> list[Row]:
        # lock is implicit: a write unit already holds the database's write lock.
        marks = ",".join("?" * len(txids))
        cur.execute(f"SELECT {cols} FROM txs WHERE txid IN ({marks})", list(txids))
        return cur.fetchall()

    def _stream(self, sql: str, params: Sequence[Any]) -> Iterator[Row]:
        # A connection of its own, so a long listing neither holds the store's lock nor sees
        # a half-finished write unit of this process. (An in-memory database exists only on
        # the store's connection: it is listed through that one, a chunk at a time.)
        if sqlite_path(self.url) == ":memory:":
            with self._read_cursor() as cur:
                cur.execute(sql, list(params))
                rows = cur.fetchall()
            yield from rows
            return
        conn = sqlite3.connect(sqlite_path(self.url), timeout=60.0)
        try:
            cur = conn.execute(sql, list(params))
            while rows := cur.fetchmany(2000):
                yield from rows
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self.close_blobs()
