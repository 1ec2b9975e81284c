"""The SQL floor of a run on SQLite: every statement the store's connection runs is recorded while
the run goes, then replayed alone, timed, on a copy of the database as it was before the run.

The replay runs the same statements with the same parameters, in the same `executemany` groups
and the same transactions, and nothing of the store's own Python. Its rate is therefore the
best any speed-up of the store's Python could reach while the statements stay what they are:
the ceiling a benchmark's target can be held against (`bench.pipeline`, `bench.prune`).

Invariants:
- Only the UTXO store's connection is recorded (a state store in a file of its own is not):
  the floor leaves out work the run also did, so it flatters the store, never the reverse.
- The copy is taken with SQLite's backup API before the recorder is installed, and the replay
  opens it with the pragmas the store opens its connection with: same starting pages, same
  settings.
- Rows a replayed SELECT returns are fetched (the run paid for them) and dropped.
- What is recorded is what went through the store's one connection (`Database._sqlite`); a
  listing's own read connection (`Database.stream`) is not, and neither the pipeline's
  store-only run nor the pruner opens one.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

from stores.utxo.sqlite import SqliteUtxoStore

PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", *SqliteUtxoStore.pragmas)

Op = tuple[bool, str, Any]  # (many, statement, parameters: a row, or a list of rows)


def _frozen(params: Any) -> Any:
    """Parameters as they are now: a bytearray (a record's slots, changed again by a later
    unit) is copied, or the replay would write its later value."""
    if isinstance(params, dict):
        return {k: bytes(v) if isinstance(v, bytearray) else v for k, v in params.items()}
    return tuple(bytes(v) if isinstance(v, bytearray) else v for v in params)


class _Cursor:
    """A cursor that records each statement once it has run (one that failed is not replayed:
    what the run's rollback undid, the replay's undoes too)."""

    def __init__(self, cur: sqlite3.Cursor, log: list[Op]) -> None:
        self._cur, self._log = cur, log

    def execute(self, sql: str, params: Any = ()) -> _Cursor:
        params = _frozen(params)
        self._cur.execute(sql, params)
        self._log.append((False, sql, params))
        return self

    def executemany(self, sql: str, rows: Iterable[Any]) -> _Cursor:
        rows = [_frozen(r) for r in rows]  # (a generator is read once: keep what it gave)
        self._cur.executemany(sql, rows)
        self._log.append((True, sql, rows))
        return self

    def executescript(self, script: str) -> Any:
        raise NotImplementedError("bench.sqlfloor does not record scripts")

    def __iter__(self) -> Any:
        return iter(self._cur)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


class _Connection:
    def __init__(self, conn: sqlite3.Connection, log: list[Op]) -> None:
        self._conn, self._log = conn, log

    def cursor(self) -> _Cursor:
        return _Cursor(self._conn.cursor(), self._log)

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        params = _frozen(params)
        cur = self._conn.execute(sql, params)
        self._log.append((False, sql, params))
        return cur

    def executemany(self, sql: str, rows: Iterable[Any]) -> sqlite3.Cursor:
        rows = [_frozen(r) for r in rows]
        cur = self._conn.executemany(sql, rows)
        self._log.append((True, sql, rows))
        return cur

    def executescript(self, script: str) -> Any:
        raise NotImplementedError("bench.sqlfloor does not record scripts")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def backup(store: Any, to: Path) -> None:
    """A consistent copy of a SQLite store's database (SQLite's backup API) at `to`."""
    copy_database(Path(store.db.path), to)


def copy_database(path: Path, to: Path) -> None:
    """A consistent copy of the SQLite database at `path` (SQLite's backup API) at `to`."""
    with closing(sqlite3.connect(path)) as src, closing(sqlite3.connect(to)) as dst:
        src.backup(dst)


def remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


class Recorder:
    """Records a SQLite UTXO store's statements from its making until `stop`; `replay` times
    them alone."""

    def __init__(self, store: Any, copy_to: Path) -> None:
        db = store.db
        if db.dialect != "sqlite":
            raise ValueError("the SQL floor is measured on SQLite only")
        self.copy = copy_to
        backup(store, copy_to)
        self.ops: list[Op] = []
        self._db = db
        # (the bench reaches into the store's connection on purpose: an instrument, not an API)
        self._real = db._sqlite
        db._sqlite = _Connection(self._real, self.ops)

    def stop(self) -> None:
        self._db._sqlite = self._real

    def counts(self) -> Counter[str]:
        """Rows per statement kind (the first word), e.g. {'INSERT': 80120, 'UPDATE': 82000}."""
        out: Counter[str] = Counter()
        for many, sql, params in self.ops:
            out[sql.split(None, 1)[0].upper()] += len(params) if many else 1
        return out

    def replay(self, keep_as: Path | None = None) -> float:
        """Seconds the recorded statements take alone, on a fresh copy of the copy taken before
        (so a replay can be repeated), removed afterwards unless `keep_as` names where to keep
        it; recorded pragmas are skipped: the copy is opened with the store's."""
        ops = [op for op in self.ops if not op[1].lstrip().upper().startswith("PRAGMA")]
        scratch = keep_as or self.copy.with_name(self.copy.name + ".replay")
        copy_database(self.copy, scratch)
        conn = sqlite3.connect(scratch, isolation_level=None, cached_statements=256)
        try:
            for pragma in PRAGMAS:
                conn.execute(pragma)
            cur = conn.cursor()
            t0 = time.perf_counter()
            for many, sql, params in ops:
                if many:
                    cur.executemany(sql, params)
                else:
                    cur.execute(sql, params)
                    cur.fetchall()
            # (no closing checkpoint: the run paid only the automatic ones, which the replay
            # pays too under the same pragmas)
            return time.perf_counter() - t0
        finally:
            conn.close()
            if keep_as is None:
                remove_database(scratch)

    def beside(self, limit: Callable[[int], float], rounds: int = 2) -> tuple[float, float]:
        """`rounds` replays, each after a run of the bench's plain limit (`limit(i)`: its
        seconds); the best seconds of each, (limit, replay): the machine's drift between a
        limit timed long before and the replays stays out of their ratio."""
        pairs = [(limit(i), self.replay()) for i in range(rounds)]
        return min(p[0] for p in pairs), min(p[1] for p in pairs)
