"""PostgreSQL backend (`postgresql://USER@HOST:PORT/DB`), through psycopg 3.

Invariants:
- A write unit is one database transaction; it locks the `txs` rows it reads with
  SELECT … ORDER BY txid FOR UPDATE (`stores.sqldb.Database.select_in`), so two units touching
  the same records serialize and always take their locks in the same order.
- `txs.id` values come from a sequence; rows are filled to 85% so that spends and state changes
  update them in place.
- Schema creation holds an advisory lock, so workers starting together do not race on DDL.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from psycopg import errors as pgerr

from stores.sqldb import keyed
from stores.utxo.sql import codec
from stores.utxo.sql.create import Copy
from stores.utxo.sql.schema import PAGES, TXS, ddl
from stores.utxo.sql.scriptindex import Entry
from stores.utxo.sql.store import SqlUtxoStore

_SCHEMA_LOCK = 0x5554584F  # "UTXO": advisory lock id for DDL
COPY_FROM = 32  # rows from which new records are copied rather than inserted
ARRAY_FROM = 8  # rows from which an update goes as one statement over arrays
TXID_KEY = "txs_txid_key"  # PostgreSQL's name for the UNIQUE constraint on txs.txid
_ENTRIES = "unnest(%b::bigint[], %b::bigint[], %b::bigint[]) AS e(sh, rid, vout)"  # (binary: cheaper)
_INSERT_ENTRIES = (
    f"INSERT INTO script_utxos (sh, rid, vout) SELECT sh, rid, vout FROM {_ENTRIES} ON CONFLICT DO NOTHING"
)
_DELETE_ENTRIES = (
    f"DELETE FROM script_utxos s USING {_ENTRIES} WHERE s.sh = e.sh AND s.rid = e.rid AND s.vout = e.vout"
)


def _pg_types() -> dict[tuple[str, str], str]:
    """(table, column) -> its PostgreSQL type, read from the DDL."""
    out: dict[tuple[str, str], str] = {}
    for table, text in (("txs", TXS.format(blob="BYTEA", bigint="BIGINT", opts="")),
                        ("tx_pages", PAGES.format(blob="BYTEA"))):  # fmt: skip
        for line in text.splitlines():
            m = re.match(r"\s+(\w+) (\w+)", line)
            if m and m.group(1) != "PRIMARY":
                out[(table, m.group(1))] = m.group(2)
    return out


_TYPES = _pg_types()


@functools.cache
def _array_update(sql: str) -> str:
    table, cols, keys = codec.SHAPES[sql]
    every = (*cols, *keys)
    arrays = ", ".join(f"%b::{_TYPES[(table, c)]}[]" for c in every)
    sets = ", ".join(f"{c} = u.{c}" for c in cols)
    where = " AND ".join(f"t.{k} = u.{k}" for k in keys)
    return f"UPDATE {table} AS t SET {sets} FROM unnest({arrays}) AS u({', '.join(every)}) WHERE {where}"


@functools.cache
def _copy_types(copy: str) -> list[str]:
    cols = copy[copy.index("(") + 1 : copy.index(")")].split(", ")
    return [_TYPES[("txs", c)].lower() for c in cols]


def _key_of(sql: str) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    n = len(codec.SHAPES[sql][2])
    return lambda row: row[-n:]


def _arrays(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows as one list per column: the array parameters of an `unnest`."""
    return [list(col) for col in zip(*rows)]


class PostgresUtxoStore(SqlUtxoStore):
    def _schema(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        cur.execute("SELECT to_regclass('txs') IS NOT NULL")
        existed = bool(cur.fetchone()[0])
        if not existed and not self.may_create:
            raise self._no_store()
        for stmt in ddl(
            "BYTEA", "BIGINT", " WITH (fillfactor = 85)", ("CREATE SEQUENCE IF NOT EXISTS txs_id_seq",)
        ):
            cur.execute(stmt)
        self._check_schema(cur, existed)

    def _insert_rows(self, cur: Any, insert: str, copy: Copy | None, rows: list[list[Any]]) -> int:
        """New records through COPY, about three times as fast as the INSERT statements for a
        block's worth. COPY has no ON CONFLICT: a txid stored already fails it whole (the
        unit rolls back), which counts as nothing inserted — the caller then sorts out which
        existed, as after a short INSERT."""
        if copy is None or len(rows) < COPY_FROM:
            return super()._insert_rows(cur, insert, copy, rows)
        sql, shared = copy
        try:
            # binary: no text made of each value, and none parsed on the server
            with cur.copy(f"{sql} (FORMAT BINARY)") as cp:
                cp.set_types(_copy_types(sql))
                for row in rows:
                    cp.write_row((*row, *shared) if shared else row)
        except pgerr.UniqueViolation as e:
            if e.diag.constraint_name != TXID_KEY:  # (a row id clash is a fault, not a race)
                raise
            return -1
        return len(rows)

    def _insert_entries(self, cur: Any, rows: list[Entry]) -> None:
        """Script index entries in one statement: a block's thousands as one executor run, not
        thousands of statements (in key order, the order concurrent units lock them in)."""
        keyed(cur, _INSERT_ENTRIES, _arrays(sorted(rows)))

    def _delete_entries(self, cur: Any, rows: list[Entry]) -> None:
        keyed(cur, _DELETE_ENTRIES, _arrays(sorted(rows)))

    def _update_rows(self, cur: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Many rows' changes as one statement over arrays (a block's spends rewrite thousands
        of parents), in key order; a few go as they are."""
        if len(rows) < ARRAY_FROM:
            return super()._update_rows(cur, sql, rows)
        keyed(cur, _array_update(sql), _arrays(sorted(rows, key=_key_of(sql))))

    def _reserve_ids(self, cur: Any, n: int) -> list[int]:
        cur.execute("SELECT nextval('txs_id_seq') FROM generate_series(1, %s)", (n,))
        return sorted(r[0] for r in cur.fetchall())
