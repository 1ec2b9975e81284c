"""PostgreSQL backend (`postgresql://USER@HOST:PORT/DB`), through psycopg 3.

Invariants:
- A write unit is one database transaction; it locks the `txs` rows it reads with
  SELECT … ORDER BY txid FOR UPDATE, so two units touching the same records serialize and always
  take their locks in the same order. Deadlocks and serialization failures are retried by
  `SqlBase._run_write`; anything else is a StorageError.
- Schema creation holds an advisory lock, so workers starting together do not race on DDL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pgerr

from stores.utxo.errors import StorageError
from stores.utxo.sql.base import Row
from stores.utxo.sql.schema import ddl
from stores.utxo.sql.store import SqlUtxoStore

_SCHEMA_LOCK = 0x5554584F  # "UTXO": advisory lock id for DDL


class PostgresUtxoStore(SqlUtxoStore):
    key_chunk = 10_000  # keys travel as one array parameter: one round trip per 10,000
    for_update = " FOR UPDATE"
    def __init__(self, url: str, **opts: Any) -> None:
        super().__init__(url, **opts)
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._connect()
        self._run_write("create schema", self._schema)
        self.block_height = self._load_block_height()

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            dsn = self.url.replace("postgresql+psycopg://", "postgresql://", 1)
            try:
                self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
            except psycopg.Error as e:
                raise StorageError(f"cannot connect to PostgreSQL at {self.url_safe}: {e}") from e
        return self._conn

    def _schema(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        # fillfactor leaves room in each page so spends and state changes update rows in place.
        opts = " WITH (fillfactor = 85)"
        cur.execute("SELECT to_regclass('txs') IS NOT NULL")
        existed = bool(cur.fetchone()[0])
        if not existed and not self.may_create:
            raise StorageError(f"no UTXO store at {self.url_safe}")
        for stmt in ddl("BYTEA", "BIGINT", opts, ("CREATE SEQUENCE IF NOT EXISTS txs_id_seq",)):
            cur.execute(stmt)
        self._check_schema_version(cur, existed)

    def _reserve_ids(self, cur: Any, n: int) -> list[int]:
        cur.execute("SELECT nextval('txs_id_seq') FROM generate_series(1, %s)", (n,))
        return sorted(r[0] for r in cur.fetchall())

    @contextmanager
    def _write_txn(self) -> Iterator[psycopg.Cursor[Any]]:
        with self._lock:
            conn = self._connect()
            with conn.transaction(), conn.cursor() as cur:
                yield cur

    @contextmanager
    def _read_cursor(self) -> Iterator[psycopg.Cursor[Any]]:
        with self._lock:
            conn = self._connect()
            with conn.transaction(), conn.cursor() as cur:
                # One snapshot for every statement of a read (a lookup in several chunks).
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                yield cur

    def _is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, (pgerr.DeadlockDetected, pgerr.SerializationFailure, pgerr.LockNotAvailable))

    def _db_errors(self) -> tuple[type[BaseException], ...]:
        return (psycopg.Error,)

    def _is_bad_value(self, exc: BaseException) -> bool:
        return isinstance(exc, (OverflowError, pgerr.DataError))

    def _q(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def _select_txs(self, cur: Any, cols: str, txids: Sequence[bytes], lock: bool) -> list[Row]:
        sql = f"SELECT {cols} FROM txs WHERE txid = ANY(%s)"
        if lock:
            sql += " ORDER BY txid FOR UPDATE"
        cur.execute(sql, (list(txids),))
        return cur.fetchall()

    def _stream(self, sql: str, params: Sequence[Any]) -> Iterator[Row]:
        # Its own connection and a server-side cursor: constant memory however long the listing.
        dsn = self.url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            with conn.cursor(name="utxo_listing") as cur:
                cur.itersize = 5000
                cur.execute(sql, list(params))
                yield from cur

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
        self.close_blobs()
