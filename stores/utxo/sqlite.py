"""SQLite backend (`sqlite:///PATH`, the embedded default).

Invariants:
- WAL journal, so readers never block the writer; every write unit starts with BEGIN IMMEDIATE
  (`stores.sqldb`), which takes the database's single write lock up front — the read-decide-write
  of a unit can therefore never interleave with another process's, and two processes spending
  one output cannot both win.
- `txs.id` values come from MAX(id) + 1 under that lock: new records append to the table.
"""

from __future__ import annotations

from typing import Any

from stores.sqldb import sqlite_path
from stores.utxo.sql.schema import ddl
from stores.utxo.sql.store import SqlUtxoStore

__all__ = ["SqliteUtxoStore", "sqlite_path"]


class SqliteUtxoStore(SqlUtxoStore):
    pragmas = (
        "PRAGMA cache_size=-131072",
        "PRAGMA temp_store=MEMORY",
        # Checkpoint the WAL every 64 MB rather than every 4 MB: a block's writes then reach the
        # main file in a few large sequential passes, not many small ones.
        "PRAGMA wal_autocheckpoint=16384",
        "PRAGMA journal_size_limit=67108864",
    )

    # outputs that live shorter than ~20,000 records never reach the script index's table
    default_index_lag = 20_000

    def _schema(self, cur: Any) -> None:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'txs'")
        existed = cur.fetchone() is not None
        if not existed and not self.may_create:
            raise self._no_store()
        # INTEGER PRIMARY KEY is SQLite's rowid: new records append to the table.
        for stmt in ddl("BLOB", "INTEGER", index_opts=" WITHOUT ROWID"):
            cur.execute(stmt)
        self._check_schema(cur, existed)

    def _reserve_ids(self, cur: Any, n: int) -> list[int]:
        # Safe without a sequence: the write unit holds the database's only write lock. Never at
        # or below the script index's mark (`sql/scriptindex.py`): the newest records deleted (a
        # refused block taken back) must not hand their ids to records the mark then covers.
        cur.execute("SELECT COALESCE(MAX(id), 0) FROM txs")
        start = max(int(cur.fetchone()[0]), self._indexed_to(cur) or 0) + 1
        return list(range(start, start + n))
