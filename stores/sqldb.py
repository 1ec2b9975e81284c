"""The one SQL layer under the UTXO and the state stores: a connection to SQLite or PostgreSQL,
write units retried on transient conflicts, consistent reads, streams, key lookups.

Invariants:
- A write unit is one database transaction holding the write lock it needs (SQLite: BEGIN
  IMMEDIATE, the whole database; PostgreSQL: the rows its statements lock, `FOR UPDATE`), and
  is retried whole on a transient conflict (busy, deadlock, serialization failure) and on a
  connection lost before its COMMIT. It is all-or-nothing: anything raised inside rolls it
  back. A connection lost in the COMMIT is not retried: the unit may have committed.
- What the database raises leaves as `StorageError` naming the operation, except a value the
  database refuses (out of range, wrong type), which is the request's fault: the `invalid` class
  the owner chose (a ProcessingError). A StoreError raised by the unit itself passes unchanged.
- A read sees one snapshot (PostgreSQL: REPEATABLE READ, READ ONLY) and takes no locks; it is
  retried on a lost connection.
- Statements use `?` placeholders; `q()` translates them for the driver. A URL's password never
  appears in a message (`mask_url`).
- One connection per object, guarded by a lock, so an object may be shared by threads; a
  listing (`stream`) runs on a connection of its own.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerr

from stores.errors import ProcessingError, StorageError, StoreError

T = TypeVar("T")
log = logging.getLogger("utxoflow.sql")
Row = tuple[Any, ...]
SQLITE = "sqlite:///"
PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
_SECRET_PARAMS = re.compile(r"(?i)((?:^|[?&;])(?:password|passwd|pass|secret|token|sslpassword)=)[^&;]*")


def mask_url(url: str) -> str:
    """`url` with the password of its user info and of secret-looking query parameters as ***."""
    if "://" in url:
        scheme, rest = url.split("://", 1)
        netloc, sep, tail = rest.partition("/")
        if "@" in netloc:
            user, host = netloc.rsplit("@", 1)
            netloc = f"{user.split(':', 1)[0]}:***@{host}" if ":" in user else f"{user}@{host}"
        url = f"{scheme}://{netloc}{sep}{tail}"
    return _SECRET_PARAMS.sub(r"\1***", url)


def sqlite_path(url: str) -> str:
    """`sqlite:///rel/path`, `sqlite:////abs/path` or `sqlite:///:memory:` → the file path."""
    if not url.startswith(SQLITE):
        raise ValueError(f"not a sqlite URL (expected {SQLITE}PATH): {url}")
    path = url[len(SQLITE) :].split("?", 1)[0]
    if not path:
        raise ValueError(f"sqlite URL has no path: {url}")
    return path


def same_sqlite_file(a: str, b: str) -> bool:
    """Whether two URLs name the same SQLite database file."""
    try:
        pa, pb = sqlite_path(a), sqlite_path(b)
    except ValueError:
        return False
    return pa != ":memory:" and Path(pa).resolve() == Path(pb).resolve()


def chunks(seq: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


class Database:
    """`sqlite:///PATH` or `postgresql://…`. `create=False` refuses a SQLite path with no file
    (the owner checks for its tables); `pragmas` tune a SQLite connection; `invalid` is the
    error a value the database refuses becomes."""

    max_retries = 8

    def __init__(
        self,
        url: str,
        *,
        what: str = "store",
        create: bool = True,
        pragmas: Sequence[str] = (),
        invalid: type[StoreError] = ProcessingError,
        busy_timeout_s: float = 60.0,
    ) -> None:
        self.url = url
        self.url_safe = mask_url(url)
        self.invalid = invalid
        self._lock = threading.RLock()
        self._held: Any = None  # the cursor of the transaction `held` keeps open
        self._held_lost = False  # an error rolled that transaction back: nothing more may run
        self._after: list[Callable[[], None]] = []  # run once `held` commits
        self._undo: list[Callable[[], None]] = []  # run if `held` (or a savepoint of it) rolls back
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme == "sqlite":
            self.dialect = "sqlite"
            self.path = sqlite_path(url)
            self.blob, self.bigint, self.for_update, self.key_chunk = "BLOB", "INTEGER", "", 500
            self.empty_blob = "X''"
            self._busy_ms = int(busy_timeout_s * 1000)
            self._open_sqlite(what, create, pragmas)
        elif scheme in PG_SCHEMES:
            self.dialect = "postgresql"
            self.path = ""
            self._dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
            # keys travel as one array parameter: one round trip per 10,000
            self.blob, self.bigint, self.for_update, self.key_chunk = "BYTEA", "BIGINT", " FOR UPDATE", 10_000
            self.empty_blob = "'\\x'::bytea"
            self._connect()
        else:
            raise ValueError(f"unknown {what} URL scheme {scheme or url!r} (known: sqlite, postgresql)")

    # -- connections ----------------------------------------------------------------------------
    def _open_sqlite(self, what: str, create: bool, pragmas: Sequence[str]) -> None:
        path = self.path
        if path != ":memory:":
            if not create and not Path(path).is_file():
                raise StorageError(f"no {what} at {path}")
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StorageError(f"cannot create the directory of {what} {path}: {e}") from e
        try:
            conn = self._sqlite = sqlite3.connect(
                path,
                isolation_level=None,
                timeout=self._busy_ms / 1000,
                check_same_thread=False,
                cached_statements=256,
            )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() not in ("wal", "memory"):
                raise StorageError(f"{what} {path} cannot use WAL journaling (got {mode!r})")
            for pragma in ("PRAGMA synchronous=NORMAL", f"PRAGMA busy_timeout={self._busy_ms}", *pragmas):
                conn.execute(pragma)
        except sqlite3.Error as e:
            self.close()
            raise StorageError(f"cannot open {what} {path}: {e}") from e
        except StorageError:
            self.close()
            raise

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
    def held(self) -> Iterator[None]:
        """SQLite: one write transaction for every unit inside (this thread's; other threads
        wait), committed at the end, rolled back whole if anything raises. A unit inside is a
        savepoint (all-or-nothing as ever); a read sees the writes before it; `after_commit`
        work waits for the end. An error that rolls the whole transaction back (disk full, I/O)
        fails every unit after it and the end: never half a transaction. Inside another `held`
        it is a savepoint of that transaction: what it wrote goes if it raises, the rest stays.
        PostgreSQL: nothing changes (units commit one by one)."""
        if self._sqlite is None:
            yield
            return
        with self._lock:
            if self._held is not None:  # already inside (this thread: the lock is ours)
                with contextmanager(self._savepoint)(self._held):
                    yield
                return
            conn = self._sqlite
            cur = conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")  # waits up to the busy timeout for the write lock
            except sqlite3.Error as e:
                cur.close()
                raise self._failure("beginning one transaction for many units", e) from e
            self._held, self._held_lost, self._after, self._undo = cur, False, [], []
            try:
                yield
                if self._held_lost or not conn.in_transaction:
                    raise StorageError(f"a transaction of many units in {self.url_safe} was rolled "
                                       "back by an error in one of them")
                cur.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                self._unwind(0, 0)  # what this process keeps of it goes back too
                if isinstance(e, sqlite3.Error):
                    raise self._failure("committing one transaction for many units", e) from e
                raise
            finally:
                after, self._held, self._after, self._undo = self._after, None, [], []
                cur.close()
        for fn in after:  # committed: the work that had to wait for it
            fn()

    def on_rollback(self, fn: Callable[[], None]) -> None:
        """Run `fn` if what this thread just wrote inside `held` is rolled back (its savepoint
        or the whole transaction): for state this process keeps beside the database (the
        store's height). Outside `held` the write is committed already: nothing to do."""
        with self._lock:
            if self._held is not None:
                self._undo.append(fn)

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run `fn` once what this thread wrote is committed: now, or at the end of `held`
        (never, if that rolls back). For work outside the database that must not precede the
        commit (deleting a blob a rolled-back row would still name)."""
        with self._lock:
            if self._held is None:
                fn()
            else:
                self._after.append(fn)

    @contextmanager
    def _txn(self, write: bool) -> Iterator[Any]:
        with self._lock:
            if self._held is not None:  # inside `held`: a unit is a savepoint of its transaction
                yield from self._savepoint(self._held)
                return
            if self._sqlite is not None:
                conn = self._sqlite
                cur = conn.cursor()
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield cur
                    cur.execute("COMMIT")
                except BaseException:
                    # also after a failed COMMIT; SQLite may have rolled back already on its own
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                finally:
                    cur.close()
            else:
                pg = self._connect()
                with pg.transaction(), pg.cursor() as pcur:
                    if not write:  # one snapshot for every statement of a read (several chunks)
                        pcur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    yield pcur

    def _savepoint(self, cur: Any) -> Iterator[Any]:
        """A unit inside `held`. Once an error has rolled the whole transaction back (SQLite
        then forgets every savepoint), no later unit runs: each fails, and so does the end.
        Work it left for after the commit (`after_commit`) goes with it when it is rolled back:
        it was for writes that did not happen."""
        assert self._sqlite is not None
        if self._held_lost:
            raise StorageError(f"a transaction of many units in {self.url_safe} was rolled back "
                               "by an error in an earlier one")
        cur.execute("SAVEPOINT unit")
        left, undo = len(self._after), len(self._undo)
        try:
            yield cur
        except BaseException:
            self._unwind(left, undo)
            if self._sqlite.in_transaction:
                cur.execute("ROLLBACK TO unit")
                cur.execute("RELEASE unit")
            else:
                self._held_lost = True
            raise
        cur.execute("RELEASE unit")

    def _unwind(self, after_from: int, undo_from: int) -> None:
        """Writes rolled back (a savepoint's: from these positions on; the transaction's: 0, 0):
        the work they left for after the commit goes, and their `on_rollback` hooks run, the
        last first."""
        del self._after[after_from:]
        hooks, self._undo = self._undo[undo_from:], self._undo[:undo_from]
        for fn in reversed(hooks):
            fn()

    # -- units of work --------------------------------------------------------------------------
    def transient(self, e: BaseException) -> bool:
        """A conflict worth retrying: busy or locked (SQLite), deadlock or serialization (PG)."""
        if isinstance(e, sqlite3.OperationalError):
            msg = str(e).lower()
            return "locked" in msg or "busy" in msg
        return isinstance(e, (pgerr.DeadlockDetected, pgerr.SerializationFailure, pgerr.LockNotAvailable))

    def _failure(self, what: str, e: BaseException) -> StoreError:
        bad_value = isinstance(e, (OverflowError, pgerr.DataError))
        kind = self.invalid if bad_value else StorageError
        return kind(f"{what} failed in {self.url_safe}: {type(e).__name__}: {e}")

    def lost(self, e: BaseException) -> bool:
        """The PostgreSQL connection is gone (terminated, server restarted, network): the next
        unit opens a new one."""
        pg = self._pg
        return isinstance(e, psycopg.OperationalError) and pg is not None and (pg.broken or pg.closed)

    def _again(self, what: str, e: BaseException, delay: float) -> float:
        """Wait `delay` before trying a unit again (saying why, when the connection was lost);
        the next delay."""
        if self.lost(e):
            first = (str(e).strip().splitlines() or [""])[0]
            log.warning("%s: the connection to %s was lost (%s: %s), trying again on a new one",
                        what, self.url_safe, type(e).__name__, first)
        time.sleep(delay)
        return min(delay * 2, 0.5)

    def write(self, what: str, fn: Callable[[Any], T], retry: bool = True, idempotent: bool = False) -> T:
        """Run `fn(cursor)` as one write unit; retry transient conflicts unless `retry` is off
        (for a unit that consumes a stream and so cannot run twice). A connection lost before
        the COMMIT is retried too (the server rolled the unit back); one lost in the COMMIT is
        not (it may have committed): it leaves as a StorageError, for the caller's idempotent
        retry — unless the unit is `idempotent` (running it twice is running it once)."""
        delay = 0.005
        for attempt in range(self.max_retries + 1 if retry else 1):
            committing = False
            try:
                with self._txn(True) as cur:
                    out = fn(cur)
                    committing = True
                return out
            except StoreError:
                raise
            except (sqlite3.Error, psycopg.Error, OverflowError) as e:
                again = self.transient(e) or ((idempotent or not committing) and self.lost(e))
                if retry and again and attempt < self.max_retries:
                    delay = self._again(what, e, delay)
                    continue
                raise self._failure(what, e) from e
        raise AssertionError("unreachable")

    def read(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run `fn(cursor)` on one snapshot; a lost connection is retried (a read changes
        nothing)."""
        delay = 0.005
        for attempt in range(self.max_retries + 1):
            try:
                with self._txn(False) as cur:
                    return fn(cur)
            except StoreError:
                raise
            except (sqlite3.Error, psycopg.Error, OverflowError) as e:
                if self.lost(e) and attempt < self.max_retries:
                    delay = self._again(what, e, delay)
                    continue
                raise self._failure(what, e) from e
        raise AssertionError("unreachable")

    def stream(self, what: str, sql: str, params: Sequence[Any] = ()) -> Iterator[Row]:
        """The rows of one read query, without holding them all: on a connection of its own, so
        a long listing neither holds this object's lock nor sees one of its units half done (an
        in-memory SQLite database exists only on this connection: it is read here, whole)."""
        try:
            if self.dialect == "sqlite":
                if self.path == ":memory:":
                    yield from self.read(what, lambda cur: cur.execute(sql, list(params)).fetchall())
                    return
                conn = sqlite3.connect(self.path, timeout=self._busy_ms / 1000)
                try:
                    cur = conn.execute(sql, list(params))
                    while rows := cur.fetchmany(2000):
                        yield from rows
                finally:
                    conn.close()
                return
            with psycopg.connect(self._dsn, connect_timeout=10) as pg, pg.cursor(name="stream") as pcur:
                pcur.itersize = 5000
                pcur.execute(self.q(sql), list(params))
                yield from pcur
        except (sqlite3.Error, psycopg.Error) as e:
            raise StorageError(f"{what} failed in {self.url_safe}: {e}") from e

    def select_in(self, cur: Any, sql: str, keys: Sequence[Any], lock: bool = False) -> list[Row]:
        """The rows of `sql` (ending in `WHERE … col`, `?` for further parameters not allowed)
        whose `col` is one of `keys`: one statement per `key_chunk` keys. With `lock` (in a write
        unit), PostgreSQL takes the rows FOR UPDATE in key order, so that units locking
        overlapping rows always lock them in the same order and cannot deadlock."""
        out: list[Row] = []
        for part in chunks(keys, self.key_chunk):
            if self.dialect == "sqlite":  # a write unit holds the whole database already
                cur.execute(f"{sql} IN ({','.join('?' * len(part))})", list(part))
            else:
                col = sql.rsplit(None, 1)[-1]
                tail = f" ORDER BY {col} FOR UPDATE" if lock else ""
                cur.execute(f"{sql} = ANY(%s){tail}", (list(part),))
            out += cur.fetchall()
        return out

    def outside(self, sql: str) -> list[Row]:
        """Run one SQLite statement outside any transaction (a WAL checkpoint, a pragma)."""
        assert self._sqlite is not None, "SQLite only"
        with self._lock:
            return self._sqlite.execute(sql).fetchall()

    def backend_pid(self) -> int:
        """The PostgreSQL server process of this object's connection (fault injection kills it)."""
        with self._lock:
            return int(self._connect().info.backend_pid)

    def close(self) -> None:
        with self._lock:
            if self._sqlite is not None:
                self._sqlite.close()
            if self._pg is not None:
                self._pg.close()
