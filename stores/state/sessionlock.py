"""A lock held for as long as a database session lives (`StateStore.session_lock`): on PostgreSQL a
session-level advisory lock on a connection of its own, so that a holder that dies — or loses its
database — lets go at once, with no lease to run out. SQLite has none (its callers use a lease).

Invariants:
- `hold` takes the lock or keeps it, and says whether this holder has it now; a session found
  gone (the connection dropped, the server restarted) is the lock lost: StorageError, and the
  next `hold` opens a new session and tries again.
- `release` closes the session, which releases the lock (nothing else can).
"""

from __future__ import annotations

from typing import Any

from stores.errors import StorageError


class AdvisoryLock:
    def __init__(self, dsn: str, lock_id: int) -> None:
        self.dsn, self.lock_id = dsn, lock_id
        self._conn: Any = None
        self._held = False

    def hold(self) -> bool:
        import psycopg

        try:
            if self._conn is None or self._conn.closed:
                self._held = False
                self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
            if self._held:
                self._conn.execute("SELECT 1")  # the lock lives as long as this session does
            else:
                row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.lock_id,)).fetchone()
                self._held = bool(row and row[0])
        except psycopg.Error as e:
            self.release()
            raise StorageError(f"the session holding advisory lock {self.lock_id} is gone: {e}") from e
        return self._held

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # (gone already: released with it)
                pass
        self._conn, self._held = None, False
