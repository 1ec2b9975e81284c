"""The chunk board: the units of one phase of one block, claimed by whichever worker is free.

A phase (create, spend, set mined) is posted as numbered units, each with a JSON spec saying
what to do; the block's coordinator and any number of helper tasks claim units one at a time,
run them, and write each unit's JSON result. A run id names one posting, so a helper that
arrives late for an earlier attempt finds nothing to claim.

Invariants:
- A unit is held by at most one live claim: claiming is one write transaction (SQLite: the
  database's write lock; PostgreSQL: the row lock, skipping rows others are claiming), and a
  claim lapses at its expiry, when anyone may take the unit again.
- A result is written only by the unit's current holder; a unit once `done` never changes.
- Cancelling a posting turns its unclaimed units to `cancelled`; held ones finish or lapse.
  Before a block is taken back, every posting of it is cancelled and its live claims are waited
  out (workers/chainstate/fanout.py `settle_block`), so no unit of it writes during or after the rollback.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the Protocol imports this module: keep psycopg out of a plain import
    from stores.sqldb import Database

TODO, HELD, DONE, CANCELLED = "todo", "held", "done", "cancelled"


def chunk_ddl(blob: str, bigint: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS chunks (
            block {blob} NOT NULL,
            phase TEXT NOT NULL,
            run TEXT NOT NULL,
            idx INTEGER NOT NULL,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            holder TEXT,
            expires_at {bigint},
            result TEXT,
            PRIMARY KEY (block, phase, run, idx)
        )""",
    ]


@dataclass(frozen=True)
class Unit:
    idx: int
    spec: dict[str, Any]


@dataclass(frozen=True)
class UnitState:
    idx: int
    state: str
    holder: str | None
    expires_at: int | None  # ms since the epoch
    result: dict[str, Any] | None


def _ms() -> int:
    return int(time.time() * 1000)


class ChunkBoardMixin:
    """The chunk board's calls on a SQL state store (`self.db`)."""

    db: Database

    def post_units(self, block: bytes, phase: str, run: str, specs: list[dict[str, Any]]) -> None:
        """Post a phase's units (replacing any earlier posting of that block and phase)."""

        def unit(cur: Any) -> None:
            q = self.db.q
            cur.execute(q("DELETE FROM chunks WHERE block = ? AND phase = ?"), (block, phase))
            cur.executemany(
                q("INSERT INTO chunks (block, phase, run, idx, spec, state) VALUES (?, ?, ?, ?, ?, ?)"),
                [(block, phase, run, i, json.dumps(s, separators=(",", ":")), TODO)
                 for i, s in enumerate(specs)],
            )

        self.db.write("post chunk units", unit)

    def claim_unit(self, block: bytes, phase: str, run: str, holder: str, ttl_s: float,
                   take_over: str | None = None) -> Unit | None:
        """Claim one unit that nobody holds (or whose claim has lapsed, or whose holder is
        `take_over`, a process known to be gone); None when there is none."""
        now = _ms()

        def unit(cur: Any) -> Unit | None:
            q = self.db.q
            skip = " FOR UPDATE SKIP LOCKED" if self.db.dialect == "postgresql" else ""
            cur.execute(
                q("SELECT idx, spec FROM chunks WHERE block = ? AND phase = ? AND run = ? AND "
                  "(state = 'todo' OR (state = 'held' AND (expires_at <= ? OR holder = ?))) "
                  f"ORDER BY idx LIMIT 1{skip}"),
                (block, phase, run, now, take_over or ""),
            )
            r = cur.fetchone()
            if r is None:
                return None
            cur.execute(
                q("UPDATE chunks SET state = 'held', holder = ?, expires_at = ? "
                  "WHERE block = ? AND phase = ? AND run = ? AND idx = ?"),
                (holder, now + int(ttl_s * 1000), block, phase, run, r[0]),
            )
            return Unit(int(r[0]), json.loads(r[1]))

        return self.db.write("claim a chunk unit", unit)

    def finish_unit(self, block: bytes, phase: str, run: str, idx: int, holder: str,
                    result: dict[str, Any] | None) -> bool:
        """Record a held unit's result (None: give it back undone, for another try). False when
        the claim is no longer this holder's (it lapsed and someone else took the unit)."""

        def unit(cur: Any) -> bool:
            q = self.db.q
            if result is None:
                cur.execute(
                    q("UPDATE chunks SET state = 'todo', holder = NULL, expires_at = NULL "
                      "WHERE block = ? AND phase = ? AND run = ? AND idx = ? AND holder = ? "
                      "AND state = 'held'"),
                    (block, phase, run, idx, holder),
                )
            else:
                cur.execute(
                    q("UPDATE chunks SET state = 'done', result = ? "
                      "WHERE block = ? AND phase = ? AND run = ? AND idx = ? AND holder = ? "
                      "AND state = 'held'"),
                    (json.dumps(result, separators=(",", ":")), block, phase, run, idx, holder),
                )
            return bool(cur.rowcount == 1)

        return self.db.write("finish a chunk unit", unit)

    def cancel_units(self, block: bytes, phase: str, run: str) -> None:
        """Nobody starts the posting's unclaimed units any more."""
        self.db.write(
            "cancel chunk units",
            lambda cur: cur.execute(
                self.db.q("UPDATE chunks SET state = 'cancelled' "
                          "WHERE block = ? AND phase = ? AND run = ? AND state = 'todo'"),
                (block, phase, run),
            ),
        )

    def unit_states(self, block: bytes, phase: str, run: str) -> list[UnitState]:
        def q(cur: Any) -> list[Any]:
            cur.execute(
                self.db.q("SELECT idx, state, holder, expires_at, result FROM chunks "
                          "WHERE block = ? AND phase = ? AND run = ? ORDER BY idx"),
                (block, phase, run),
            )
            return list(cur.fetchall())

        return [
            UnitState(int(r[0]), r[1], r[2], None if r[3] is None else int(r[3]),
                      None if r[4] is None else json.loads(r[4]))
            for r in self.db.read("read chunk units", q)
        ]

    def drop_units(self, block: bytes, phase: str | None = None, run: str | None = None) -> None:
        """Forget a block's postings (every phase, or one; every run, or one)."""
        sql, args = "DELETE FROM chunks WHERE block = ?", list[bytes | str]([block])
        for col, val in (("phase", phase), ("run", run)):
            if val is not None:
                sql += f" AND {col} = ?"
                args.append(val)
        self.db.write("drop chunk units", lambda cur: cur.execute(self.db.q(sql), tuple(args)))

    def cancel_block(self, block: bytes) -> None:
        """Nobody starts any unclaimed unit of any posting of this block any more."""
        self.db.write(
            "cancel a block's units",
            lambda cur: cur.execute(
                self.db.q("UPDATE chunks SET state = 'cancelled' WHERE block = ? AND state = 'todo'"),
                (block,),
            ),
        )

    def live_holders(self, block: bytes) -> list[str]:
        """Holders of this block's units whose claims have not lapsed (they may still write)."""
        now = _ms()

        def q(cur: Any) -> list[Any]:
            cur.execute(
                self.db.q("SELECT DISTINCT holder FROM chunks WHERE block = ? AND state = 'held' "
                          "AND expires_at > ?"),
                (block, now),
            )
            return list(cur.fetchall())

        return [str(r[0]) for r in self.db.read("read chunk holders", q)]
