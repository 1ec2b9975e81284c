"""A small SQL database handle for the stores that are plain tables (the state store): one
connection, write units with retries on transient conflicts, reads, for SQLite and PostgreSQL.

Invariants:
- A write unit is one database transaction holding the write lock it needs (SQLite: BEGIN
  IMMEDIATE, the whole database; PostgreSQL: the rows its statements lock), retried whole on a
  transient conflict (busy, deadlock, serialization failure); anything else the database raises
  leaves as StorageError naming the operation, with the unit rolled back.
- Statements use `?` placeholders; `q()` translates them for the driver.
- A URL's password never appears in a message (`mask_url`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerr

from stores.utxo.errors import StorageError, UtxoError
from stores.utxo.sql.base import mask_url
from stores.utxo.sqlite import sqlite_path

T = TypeVar("T")


class Database:
    """`sqlite:///PATH` or `postgresql://…`; `create=False` refuses a URL that holds nothing."""

    def __init__(self, url: str, *, create: bool = True, busy_timeout_s: float = 60.0) -> None:
        self.url = url
        self.url_safe = mask_url(url)
        self._lock = threading.RLock()
        scheme = url.split("://", 1)[0].lower()
        if scheme == "sqlite":
            self.dialect = "sqlite"
            path = sqlite_path(url)
            if path != ":memory:":
                if not create and not Path(path).is_file():
                    raise StorageError(f"no state store at {path}")
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            try:
                self._sqlite = sqlite3.connect(
                    path, isolation_level=None, timeout=busy_timeout_s, check_same_thread=False
                )
                self._sqlite.execute("PRAGMA journal_mode=WAL").fetchone()
                self._sqlite.execute("PRAGMA synchronous=NORMAL")
                self._sqlite.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            except sqlite3.Error as e:
                raise StorageError(f"cannot open state store {path}: {e}") from e
            self.blob, self.bigint = "BLOB", "INTEGER"
        elif scheme in ("postgresql", "postgres", "postgresql+psycopg"):
            self.dialect = "postgresql"
            self._dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
            self._pg: psycopg.Connection[Any] | None = None
            self._connect()
            self.blob, self.bigint = "BYTEA", "BIGINT"
        else:
            raise ValueError(f"unknown state store URL scheme {scheme!r} (known: sqlite, postgresql)")

    def _connect(self) -> psycopg.Connection[Any]:
        if self._pg is None or self._pg.closed or self._pg.broken:
            try:
                self._pg = psycopg.connect(self._dsn, autocommit=True, connect_timeout=10)
            except psycopg.Error as e:
                raise StorageError(f"cannot connect to PostgreSQL at {self.url_safe}: {e}") from e
        return self._pg

    def q(self, sql: str) -> str:
        return sql if self.dialect == "sqlite" else sql.replace("?", "%s")

    @contextmanager
    def _txn(self, write: bool) -> Iterator[Any]:
        with self._lock:
            if self.dialect == "sqlite":
                cur = self._sqlite.cursor()
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield cur
                    cur.execute("COMMIT")
                except BaseException:
                    if self._sqlite.in_transaction:
                        self._sqlite.execute("ROLLBACK")
                    raise
                finally:
                    cur.close()
            else:
                conn = self._connect()
                with conn.transaction(), conn.cursor() as pcur:
                    yield pcur

    def _transient(self, e: BaseException) -> bool:
        if isinstance(e, sqlite3.OperationalError):
            return "locked" in str(e).lower() or "busy" in str(e).lower()
        return isinstance(e, (pgerr.DeadlockDetected, pgerr.SerializationFailure, pgerr.LockNotAvailable))

    def write(self, what: str, fn: Callable[[Any], T], retries: int = 8) -> T:
        delay = 0.005
        for attempt in range(retries + 1):
            try:
                with self._txn(True) as cur:
                    return fn(cur)
            except UtxoError:
                raise
            except (sqlite3.Error, psycopg.Error) as e:
                if self._transient(e) and attempt < retries:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                raise StorageError(f"{what} failed in {self.url_safe}: {type(e).__name__}: {e}") from e
        raise AssertionError("unreachable")

    def read(self, what: str, fn: Callable[[Any], T]) -> T:
        try:
            with self._txn(False) as cur:
                return fn(cur)
        except UtxoError:
            raise
        except (sqlite3.Error, psycopg.Error) as e:
            raise StorageError(f"{what} failed in {self.url_safe}: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        with self._lock:
            if self.dialect == "sqlite":
                self._sqlite.close()
            elif self._pg is not None:
                self._pg.close()
