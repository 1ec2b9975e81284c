"""A snapshot file's checked entries on disk: a temporary SQLite database, so memory stays constant
however large the snapshot, and stdin works as well as a file (it is read once).

Invariants:
- Nothing leaves the spool before every line has been read and checked: `load` reads the whole
  input, then refuses a duplicated output and a txid whose entries disagree on height or
  coinbase (SnapshotError naming the line).
- Entries created above the snapshot height are kept out of what is imported, and counted.
- `batches` gives the entries in (txid, vout) order and never splits a transaction's outputs
  (the store makes one record per txid per call).
- The database is this process's own scratch file, in a directory the caller made and removes:
  no store's data is ever in it.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from chain import hash_to_hex, is_data_carrier
from stores.state import Commitment
from stores.utxo import Utxo
from workers.snapshots.fileformat import SnapshotError, parse_entry

IMPORT_BATCH = 50_000
_SPOOL_ROWS = 10_000

Entry = tuple[bytes, int, int, bytes, int, int, int]  # txid, vout, sats, script, height, coinbase, line


@dataclass
class SpoolCounts:
    lines: int = 0  # non-blank lines read
    entries: int = 0  # entries at or below the snapshot height
    skipped: int = 0  # entries created above the snapshot height
    data_carriers: int = 0  # entries of the snapshot that never enter the UTXO set


class Spool:
    """The checked entries of a snapshot file, in a temporary SQLite database."""

    def __init__(self, directory: Path) -> None:
        self.db = sqlite3.connect(directory / "snapshot.db", isolation_level=None)
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "temp_store=FILE", "cache_size=-65536"):
            self.db.execute(f"PRAGMA {pragma}")
        self.db.execute(
            "CREATE TABLE e (txid BLOB, vout INTEGER, sats INTEGER, script BLOB, height INTEGER, "
            "coinbase INTEGER, line INTEGER)"
        )
        self.counts = SpoolCounts()

    def close(self) -> None:
        self.db.close()

    def load(
        self, lines: Iterable[bytes], height: int, advance: Callable[[int], None], first_line: int = 1,
        hashed: bool = False,
    ) -> Commitment | None:
        """Spool and check every line. With `hashed`, the commitment of what the import would
        write (`workers.chainstate.commitment`), computed in the same pass; it means something only once
        the checks have passed (they refuse a duplicated output, which it would count twice)."""
        from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)

        self.db.execute("BEGIN")
        entries = self._spool(lines, height, advance, first_line)
        found = commitment.of_utxos(entries) if hashed else None
        if found is None:
            deque(entries, maxlen=0)
        self.db.execute("COMMIT")
        self.db.execute("CREATE INDEX e_key ON e (txid, vout)")
        self._check()
        return found

    def _spool(
        self, lines: Iterable[bytes], height: int, advance: Callable[[int], None], first_line: int
    ) -> Iterator[Utxo]:
        """Parse and spool each line; yield the entries that enter the UTXO set: at or below
        `height`, and not data carriers."""
        c = self.counts
        rows: list[Entry] = []
        for lineno, raw in enumerate(lines, first_line):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise SnapshotError(f"line {lineno}: not UTF-8 text") from None
            if not text.strip():
                continue
            try:
                txid, vout, sats, script, h, cb = parse_entry(text, height)
            except ValueError as e:
                raise SnapshotError(f"line {lineno}: {e}") from None
            c.lines += 1
            if h > height:
                c.skipped += 1
            elif is_data_carrier(sats, script):
                c.entries += 1
                c.data_carriers += 1
            else:
                c.entries += 1
                yield Utxo(txid, vout, sats, script, h, cb)
            rows.append((txid, vout, sats, script, h, int(cb), lineno))
            if len(rows) >= _SPOOL_ROWS:
                self._flush(rows, advance)
        self._flush(rows, advance)

    def _flush(self, rows: list[Entry], advance: Callable[[int], None]) -> None:
        self.db.executemany("INSERT INTO e VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        advance(len(rows))
        rows.clear()

    def _check(self) -> None:
        dup = self.db.execute(
            "SELECT txid, vout, MIN(line), MAX(line) FROM e GROUP BY txid, vout "
            "HAVING COUNT(*) > 1 ORDER BY MAX(line) LIMIT 1"
        ).fetchone()
        if dup is not None:
            op = f"{hash_to_hex(dup[0])}:{dup[1]}"
            raise SnapshotError(f"line {dup[3]}: output {op} is listed twice (also on line {dup[2]})")
        odd = self.db.execute(
            "SELECT txid, MAX(line) FROM e GROUP BY txid "
            "HAVING COUNT(DISTINCT height) > 1 OR COUNT(DISTINCT coinbase) > 1 ORDER BY MAX(line) LIMIT 1"
        ).fetchone()
        if odd is not None:
            raise SnapshotError(
                f"line {odd[1]}: the outputs of tx {hash_to_hex(odd[0])} disagree on 'height' or 'coinbase'"
            )

    def batches(self, height: int, size: int = IMPORT_BATCH) -> Iterator[list[Utxo]]:
        """The snapshot's entries in (txid, vout) order, never splitting a txid across batches."""
        batch: list[Utxo] = []
        cur = self.db.execute(
            "SELECT txid, vout, sats, script, height, coinbase FROM e WHERE height <= ? ORDER BY txid, vout",
            (height,),
        )
        while rows := cur.fetchmany(_SPOOL_ROWS):
            for txid, vout, sats, script, h, cb in rows:
                if len(batch) >= size and batch[-1].txid != txid:
                    yield batch
                    batch = []
                batch.append(Utxo(txid, vout, sats, script, h, bool(cb)))
        if batch:
            yield batch
