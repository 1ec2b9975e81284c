"""Connection handling, row decoding and the record state shared by the SQL operations.

Invariants:
- Every change runs inside `_write`, which holds the database's write lock for the rows it
  touches (SQLite: the whole database via BEGIN IMMEDIATE; PostgreSQL: the txs rows, taken
  FOR UPDATE in txid order so that concurrent batches cannot deadlock each other), and retries
  the whole unit when the database reports a transient conflict. A unit is all-or-nothing.
- `outputs` rows of a transaction are only written while its `txs` row is locked.
- Database failures leave as StorageError naming the operation; nothing half-applied remains,
  because the unit's transaction is rolled back.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from chain import hash_to_hex
from stores.utxo import validate
from stores.utxo.errors import ProcessingError, StorageError, TxNotFound, UtxoError
from stores.utxo.rules import next_dah

T = TypeVar("T")
Row = tuple[Any, ...]
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


SCHEMA_VERSION = "utxoflow-sql-5"  # bump on any change existing stores cannot be read with
CHUNK = 500  # keys per IN list: well under SQLite's parameter limit

STATE_COLS = (
    "txid, locked, creating, conflicting, is_coinbase, spending_height, unmined_since, "
    "preserve_until, delete_at_height, total_utxos, spent_utxos, blocks, conflicting_children, "
    "inpoints, id, external"
)
WRITE_STATE = (
    "UPDATE txs SET locked = ?, creating = ?, conflicting = ?, unmined_since = ?, "
    "preserve_until = ?, delete_at_height = ?, spent_utxos = ?, blocks = ?, "
    "conflicting_children = ? WHERE txid = ?"
)


@dataclass(slots=True)
class TxState:
    """The mutable part of a `txs` row, read under lock and written back by `write_states`."""

    txid: bytes
    locked: bool
    creating: bool
    conflicting: bool
    is_coinbase: bool
    spending_height: int
    unmined_since: int | None
    preserve_until: int | None
    delete_at_height: int | None
    total_utxos: int
    spent_utxos: int
    blocks: list[list[int]]
    conflicting_children: bytes
    inpoints: bytes
    id: int
    external: bool

    @classmethod
    def from_row(cls, r: Row) -> TxState:
        return cls(
            bytes(r[0]),
            bool(r[1]),
            bool(r[2]),
            bool(r[3]),
            bool(r[4]),
            r[5],
            r[6],
            r[7],
            r[8],
            r[9],
            r[10],
            json.loads(r[11]),
            bytes(r[12]),
            bytes(r[13]),
            r[14],
            bool(r[15]),
        )

    def recompute_dah(self, height: int, retention: int) -> None:
        self.delete_at_height = next_dah(
            current=self.delete_at_height,
            conflicting=self.conflicting,
            locked=self.locked,
            preserve_until=self.preserve_until,
            spent=self.spent_utxos,
            utxos=self.total_utxos,
            mined_on_longest=self.unmined_since is None and bool(self.blocks),
            height=height,
            retention=retention,
        )

    def row(self) -> Row:
        return (
            int(self.locked),
            int(self.creating),
            int(self.conflicting),
            self.unmined_since,
            self.preserve_until,
            self.delete_at_height,
            self.spent_utxos,
            json.dumps(self.blocks, separators=(",", ":")),
            self.conflicting_children,
            self.txid,
        )


def split_inpoints(blob: bytes) -> list[tuple[bytes, int]]:
    return [
        (blob[i : i + 32], int.from_bytes(blob[i + 32 : i + 36], "little")) for i in range(0, len(blob), 36)
    ]


def chunks(seq: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


class SqlBase(ABC):
    """What the two SQL dialects provide, and the helpers built on it."""

    url: str
    block_height: int
    retention: int
    max_retries = 8
    key_chunk = CHUNK  # keys per lookup statement; a dialect without a parameter limit raises it
    for_update = ""  # suffix of a SELECT that locks its rows in a write unit (PostgreSQL's)

    def _chunks(self, seq: Sequence[T]) -> Iterator[Sequence[T]]:
        return chunks(seq, self.key_chunk)

    # -- dialect hooks ------------------------------------------------------------------------
    @abstractmethod
    def _write_txn(self) -> AbstractContextManager[Any]:
        """A write transaction holding the write lock; yields a cursor."""

    @abstractmethod
    def _read_cursor(self) -> AbstractContextManager[Any]:
        """A cursor for consistent reads that take no locks."""

    @abstractmethod
    def _is_transient(self, exc: BaseException) -> bool:
        """True for conflicts worth retrying (deadlock, serialization failure, busy)."""

    @abstractmethod
    def _db_errors(self) -> tuple[type[BaseException], ...]:
        """The driver's error classes, mapped to StorageError."""

    @abstractmethod
    def _select_txs(self, cur: Any, cols: str, txids: Sequence[bytes], lock: bool) -> list[Row]:
        """Rows of `txs` for these txids (lock=True: FOR UPDATE, in txid order)."""

    @abstractmethod
    def _reserve_ids(self, cur: Any, n: int) -> list[int]:
        """n fresh `txs.id` values, increasing (called inside a write unit)."""

    @abstractmethod
    def _q(self, sql: str) -> str:
        """Translate `?` placeholders to the driver's."""

    @abstractmethod
    def _stream(self, sql: str, params: Sequence[Any]) -> Iterator[Row]:
        """Run a read query and yield its rows without holding them all in memory."""

    @abstractmethod
    def get_outputs(self, outpoints: Sequence[tuple[bytes, int]]) -> dict[tuple[bytes, int], Any]:
        """OutputInfo per known outpoint (ReadMixin)."""

    # -- running units of work ----------------------------------------------------------------
    def _run_write(self, what: str, fn: Callable[[Any], T], retry: bool = True) -> T:
        """Run `fn(cursor)` as one write unit; retry transient conflicts unless `retry` is off
        (for units that consume a stream and so cannot run twice)."""
        delay = 0.005
        for attempt in range(self.max_retries + 1 if retry else 1):
            try:
                with self._write_txn() as cur:
                    return fn(cur)
            except UtxoError:
                raise
            except self._failures() as e:
                if retry and self._is_transient(e) and attempt < self.max_retries:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                raise self._wrap(what, e) from e
        raise AssertionError("unreachable")

    def _run_read(self, what: str, fn: Callable[[Any], T]) -> T:
        try:
            with self._read_cursor() as cur:
                return fn(cur)
        except UtxoError:
            raise
        except self._failures() as e:
            raise self._wrap(what, e) from e

    def _failures(self) -> tuple[type[Exception], ...]:
        """What a unit of work may raise that is the database's doing (or its verdict on a value)."""
        return (*self._db_errors(), OverflowError)  # type: ignore[return-value]

    def _is_bad_value(self, exc: BaseException) -> bool:
        """True when the database refused a value (out of range, wrong type): the request is at
        fault, not the store, and retrying it cannot help."""
        return isinstance(exc, OverflowError)

    def _wrap(self, what: str, e: BaseException) -> UtxoError:
        kind = ProcessingError if self._is_bad_value(e) else StorageError
        return kind(f"{what} failed in {self.url_safe}: {type(e).__name__}: {e}")

    @property
    def url_safe(self) -> str:
        """The URL with any password (user info or query parameter) masked, for messages."""
        return mask_url(self.url)

    # -- helpers ------------------------------------------------------------------------------
    def _height(self, hint: int = 0) -> int:
        """The current height for DAH and reassign: the caller's or the store's, whichever is
        higher (another process may have moved the store on since this one last looked)."""
        return max(self.block_height, hint)


    def _load_states(self, cur: Any, txids: Iterable[bytes]) -> dict[bytes, TxState]:
        keys = sorted(set(txids))
        out: dict[bytes, TxState] = {}
        for part in self._chunks(keys):
            for r in self._select_txs(cur, STATE_COLS, part, True):
                s = TxState.from_row(r)
                out[s.txid] = s
        return out

    def _write_states(self, cur: Any, states: Iterable[TxState]) -> None:
        rows = [s.row() for s in states]
        if rows:
            cur.executemany(self._q(WRITE_STATE), rows)

    def _update_states(
        self,
        what: str,
        txids: Sequence[bytes],
        change: Callable[[TxState, int], None],
        hint: int = 0,
        missing_ok: bool = True,
    ) -> list[UtxoError | None]:
        """Apply `change(state, height)` to each record under lock, then recompute its DAH."""
        height = self._height(hint)

        def unit(cur: Any) -> list[UtxoError | None]:
            states = self._load_states(cur, txids)
            result: list[UtxoError | None] = []
            for t in txids:
                s = states.get(t)
                if s is None:
                    err = TxNotFound(f"tx {hash_to_hex(t)} not found", txid=t)
                    if not missing_ok:
                        raise err  # inside the unit: nothing of the call is applied
                    result.append(err)
                    continue
                change(s, height)
                s.recompute_dah(height, self.retention)
                result.append(None)
            self._write_states(cur, states.values())
            return result

        validate.txids(txids)
        return self._run_write(what, unit)

    def _set_meta(self, cur: Any, key: str, value: str) -> None:
        cur.execute(self._q("DELETE FROM meta WHERE key = ?"), (key,))
        cur.execute(self._q("INSERT INTO meta (key, value) VALUES (?, ?)"), (key, value))

    def set_block_height(self, height: int) -> None:
        validate.height("block height", height, zero_ok=False)
        self._run_write("set_block_height", lambda cur: self._set_meta(cur, "block_height", str(height)))
        self.block_height = height

    def _check_schema_version(self, cur: Any, existed: bool) -> None:
        """Stamp a new store with SCHEMA_VERSION; refuse one written by an incompatible version."""
        cur.execute("SELECT value FROM meta WHERE key = 'schema'")
        r = cur.fetchone()
        if r is None and not existed:
            cur.execute(self._q("INSERT INTO meta (key, value) VALUES ('schema', ?)"), (SCHEMA_VERSION,))
            self._check_batch_size(cur)
            return
        found = r[0] if r else "unversioned"
        if found != SCHEMA_VERSION:
            raise StorageError(
                f"{self.url_safe} holds a UTXO store of schema {found!r}; this version needs "
                f"{SCHEMA_VERSION!r} (point UTXO_STORE_URL at a new store)"
            )
        self._check_batch_size(cur)

    def _check_batch_size(self, cur: Any) -> None:
        """The batch size decides which record holds which output, so a store keeps the one it
        was created with; opening it with another is refused rather than misreading pages."""
        cur.execute("SELECT value FROM meta WHERE key = 'batch_size'")
        r = cur.fetchone()
        want: int = getattr(self, "batch_size", 0)
        if r is None:
            cur.execute(self._q("INSERT INTO meta (key, value) VALUES ('batch_size', ?)"), (str(want),))
        elif int(r[0]) != want:
            raise StorageError(
                f"{self.url_safe} was created with UTXO_BATCH_SIZE={r[0]}; it cannot be opened with "
                f"{want} (outputs would be looked up in the wrong records)"
            )

    def _stored_height(self, cur: Any) -> int:
        """The block height persisted by set_block_height (0 before the first)."""
        cur.execute("SELECT value FROM meta WHERE key = 'block_height'")
        r = cur.fetchone()
        return int(r[0]) if r else 0

    def _load_block_height(self) -> int:
        return self._run_read("read block height", self._stored_height)
