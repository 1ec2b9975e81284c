"""The pruner's jobs in the state store (table `prune_jobs`), for SQLite and PostgreSQL: the
request slot, the run lock and the history (Teranode's pruner service, "job manager";
workers/pruning/pruner.py runs them).

Invariants:
- At most one job is `pending` (the slot) and at most one `running` (the lock): every change
  runs in one write unit that holds the job manager's lock (SQLite: the write lock of BEGIN
  IMMEDIATE; PostgreSQL: a transaction-level advisory lock), so two requests or two takers
  never both see an empty slot or a free lock.
- Latest height wins: a request above the pending job's height cancels it and takes the slot; a
  request at or below it is answered by it, as one at or below a live run's height is by that
  run; a request at or below the last height a run completed (`done`) is answered at once by
  the job that completed it, and a job left waiting at or below `done` is cancelled, not run.
- A running job holds a lease (`holder`, `lease_until`), renewed by its runner. When the lease
  has lapsed (or its holder is a dead process of this host), or the job is older than the job
  timeout, the next taker fails it, frees the lock and, unless a higher job is waiting, puts
  its height back in the slot: nothing requested is forgotten because a worker died.
- The history keeps the newest `HISTORY` finished jobs; pending and running ones are never
  dropped.
- `done` (the highest height a run completed) lives in the `chain` table, not in the history,
  so trimming the history never forgets it.
- Times are integer milliseconds since the epoch in the table, seconds (float) in `PruneJob`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from stores.lease import lapsed
from stores.sqldb import Database, increasing_key

HISTORY = 1000
DONE_KEY = "prune_done"  # in the `chain` table: the highest height a run completed
PENDING, RUNNING, COMPLETED, FAILED, CANCELLED = "pending", "running", "completed", "failed", "cancelled"
_LOCK = 0x5052554E  # "PRUN": PostgreSQL's advisory lock of the job manager
COLS = "id, height, status, requested_at, started_at, ended_at, holder, lease_until, figures, error"


def prune_ddl(dialect: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS prune_jobs (
            id {increasing_key(dialect)},
            height BIGINT NOT NULL,
            status TEXT NOT NULL,
            requested_at BIGINT NOT NULL,
            started_at BIGINT,
            ended_at BIGINT,
            holder TEXT,
            lease_until BIGINT,
            figures TEXT NOT NULL,
            error TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS prune_jobs_open ON prune_jobs (status) "
        "WHERE status IN ('pending', 'running')",
    ]


@dataclass(frozen=True, slots=True)
class PruneJob:
    id: int
    height: int
    status: str
    requested_at: float
    started_at: float | None
    ended_at: float | None
    holder: str | None
    lease_until: float | None
    figures: dict[str, Any]
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "height": self.height, "status": self.status,
            "requested_at": self.requested_at, "started_at": self.started_at, "ended_at": self.ended_at,
            "holder": self.holder, **({"error": self.error} if self.error else {}), "figures": self.figures,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Requested:
    """What a request did: the job that answers it, and whether a runner must be started for it
    (False when the job is already done, or a live runner will take it when it finishes)."""

    job: PruneJob
    start: bool


def _s(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _job(r: Any) -> PruneJob:
    return PruneJob(
        int(r[0]), int(r[1]), str(r[2]), r[3] / 1000, _s(r[4]), _s(r[5]), r[6], _s(r[7]),
        json.loads(r[8]), r[9],
    )


def _ms() -> int:
    return int(time.time() * 1000)


class PruneJobs:
    """Mixed into the SQL state store (it provides `db`)."""

    db: Database
    prune_history: int = HISTORY  # finished jobs kept

    def _jobs_lock(self, cur: Any) -> None:
        if self.db.dialect == "postgresql":
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))

    def _one(self, cur: Any, where: str, args: tuple[Any, ...] = ()) -> PruneJob | None:
        sql = f"SELECT {COLS} FROM prune_jobs WHERE {where} ORDER BY id DESC LIMIT 1"
        cur.execute(self.db.q(sql), args)
        r = cur.fetchone()
        return None if r is None else _job(r)

    def _done(self, cur: Any) -> int | None:
        cur.execute(self.db.q("SELECT value FROM chain WHERE key = ?"), (DONE_KEY,))
        r = cur.fetchone()
        return None if r is None else int(r[0])

    def _end(self, cur: Any, job_id: int, status: str, now: int, why: str) -> None:
        cur.execute(self.db.q("UPDATE prune_jobs SET status = ?, ended_at = ?, error = ?, lease_until = NULL "
                              "WHERE id = ?"), (status, now, why, job_id))

    def _insert(self, cur: Any, height: int, now: int) -> PruneJob:
        cur.execute(
            self.db.q("INSERT INTO prune_jobs (height, status, requested_at, figures) "
                      "VALUES (?, ?, ?, '{}')"),
            (height, PENDING, now),
        )
        job = self._one(cur, "status = ?", (PENDING,))
        assert job is not None
        return job

    def _live(self, job: PruneJob | None, now: int, timeout_ms: int) -> bool:
        if job is None or job.lease_until is None:
            return False
        started = int((job.started_at or 0) * 1000)
        return not lapsed(job.holder, int(job.lease_until * 1000), now) and now - started < timeout_ms

    def prune_request(self, height: int, timeout_s: float) -> Requested:
        """Ask for a run at `height` (see the invariants)."""
        now = _ms()

        def unit(cur: Any) -> Requested:
            self._jobs_lock(cur)
            done = self._done(cur)
            if done is not None and height <= done:
                answer = self._one(cur, "status = ? AND height >= ?", (COMPLETED, height))
                if answer is not None:  # (else: out of the history: run again, harmlessly)
                    return Requested(answer, False)
            running = self._one(cur, "status = ?", (RUNNING,))
            live = self._live(running, now, int(timeout_s * 1000))
            if live and running is not None and running.height >= height:
                return Requested(running, False)  # the run under way covers it
            pending = self._one(cur, "status = ?", (PENDING,))
            if pending is not None and pending.height >= height:
                return Requested(pending, not live)
            if pending is not None:
                self._end(cur, pending.id, CANCELLED, now, f"replaced by a request at height {height}")
            job = self._insert(cur, height, now)
            self._trim(cur)
            return Requested(job, not live)

        return self.db.write("request a prune run", unit)

    def prune_take(self, holder: str, ttl_s: float, timeout_s: float) -> PruneJob | None:
        """The pending job, now running under `holder`'s lease; None when the slot is empty or a
        live runner holds the lock. A running job whose lease lapsed or that is past the job
        timeout is failed first, and its height goes back in the slot (see the invariants)."""
        now = _ms()

        def unit(cur: Any) -> PruneJob | None:
            self._jobs_lock(cur)
            q = self.db.q
            running = self._one(cur, "status = ?", (RUNNING,))
            if running is not None:
                if self._live(running, now, int(timeout_s * 1000)):
                    return None
                old = now - int((running.started_at or 0) * 1000) >= timeout_s * 1000
                why = "timed out" if old else "its runner stopped renewing the lock (a worker died?)"
                self._end(cur, running.id, FAILED, now, why)
                pending = self._one(cur, "status = ?", (PENDING,))
                done = self._done(cur)
                higher = pending is not None and pending.height >= running.height
                if not higher and (done is None or running.height > done):
                    if pending is not None:
                        why = f"replaced by the retry of job {running.id}"
                        self._end(cur, pending.id, CANCELLED, now, why)
                    self._insert(cur, running.height, now)
            pending = self._one(cur, "status = ?", (PENDING,))
            if pending is None:
                return None
            done = self._done(cur)
            if done is not None and pending.height <= done:  # a run covered it since it was asked
                self._end(cur, pending.id, CANCELLED, now, f"covered by the run that completed height {done}")
                return None
            cur.execute(
                q("UPDATE prune_jobs SET status = ?, started_at = ?, holder = ?, lease_until = ? "
                  "WHERE id = ?"),
                (RUNNING, now, holder, now + int(ttl_s * 1000), pending.id),
            )
            return self._one(cur, "id = ?", (pending.id,))

        return self.db.write("take a prune job", unit)

    def prune_renew(self, job_id: int, holder: str, ttl_s: float, figures: dict[str, Any]) -> bool:
        """Extend the run's lease and record its figures so far; False if it is no longer this
        holder's running job (failed by a taker: the run must stop)."""
        now = _ms()

        def unit(cur: Any) -> bool:
            cur.execute(
                self.db.q("UPDATE prune_jobs SET lease_until = ?, figures = ? "
                          "WHERE id = ? AND holder = ? AND status = ?"),
                (now + int(ttl_s * 1000), json.dumps(figures), job_id, holder, RUNNING),
            )
            return bool(cur.rowcount == 1)

        return self.db.write("renew a prune job", unit)

    def prune_finish(self, job_id: int, holder: str, status: str, figures: dict[str, Any],
                     error: str | None = None) -> bool:
        """End the run (completed, failed, or cancelled: skipped, with the reason as `error`);
        False if it was no longer this holder's."""
        now = _ms()

        def unit(cur: Any) -> bool:
            self._jobs_lock(cur)
            cur.execute(
                self.db.q("UPDATE prune_jobs SET status = ?, ended_at = ?, figures = ?, error = ?, "
                          "lease_until = NULL WHERE id = ? AND holder = ? AND status = ?"),
                (status, now, json.dumps(figures), error, job_id, holder, RUNNING),
            )
            ok = bool(cur.rowcount == 1)
            job = self._one(cur, "id = ?", (job_id,))
            if ok and status == COMPLETED and job is not None:
                done = self._done(cur)
                if done is None or job.height > done:
                    cur.execute(self.db.q("DELETE FROM chain WHERE key = ?"), (DONE_KEY,))
                    cur.execute(self.db.q("INSERT INTO chain (key, value) VALUES (?, ?)"),
                                (DONE_KEY, str(job.height)))
            self._trim(cur)
            return ok

        return self.db.write("finish a prune job", unit)

    def _trim(self, cur: Any) -> None:
        cur.execute(
            self.db.q("DELETE FROM prune_jobs WHERE status NOT IN (?, ?) AND id < (SELECT MIN(id) FROM "
                      "(SELECT id FROM prune_jobs WHERE status NOT IN (?, ?) ORDER BY id DESC LIMIT ?) "
                      "AS keep)"),
            (PENDING, RUNNING, PENDING, RUNNING, self.prune_history),
        )

    def prune_jobs(self, limit: int = 20) -> list[PruneJob]:
        """The newest jobs first."""

        def q(cur: Any) -> list[PruneJob]:
            cur.execute(self.db.q(f"SELECT {COLS} FROM prune_jobs ORDER BY id DESC LIMIT ?"), (limit,))
            return [_job(r) for r in cur.fetchall()]

        return self.db.read("list prune jobs", q)

    def prune_open_jobs(self) -> tuple[PruneJob | None, PruneJob | None]:
        """(the running job, the pending job), each None when there is none."""

        def q(cur: Any) -> tuple[PruneJob | None, PruneJob | None]:
            return self._one(cur, "status = ?", (RUNNING,)), self._one(cur, "status = ?", (PENDING,))

        return self.db.read("open prune jobs", q)

    def prune_job(self, job_id: int) -> PruneJob | None:
        return self.db.read("read a prune job", lambda cur: self._one(cur, "id = ?", (job_id,)))

    def blocks_settled_between(self, above: int, upto: int) -> list[tuple[bytes, int]]:
        """Blocks at heights in (above, upto] that no longer wait to be applied (applied, side,
        invalid): whose bodies the pruner may remove once below the retention."""

        def q(cur: Any) -> list[tuple[bytes, int]]:
            sql = ("SELECT hash, height FROM blocks WHERE height > ? AND height <= ? "
                   "AND status IN ('applied', 'side', 'invalid') ORDER BY height")
            cur.execute(self.db.q(sql), (above, upto))
            return [(bytes(r[0]), int(r[1])) for r in cur.fetchall()]

        return self.db.read("settled blocks", q)

    def prune_done_height(self) -> int | None:
        """The highest height a run has completed (None: none has)."""
        return self.db.read("prune height", self._done)
