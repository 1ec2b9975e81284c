"""`utxo import-utxos`: seed an empty store with a UTXO snapshot taken at a block.

Invariants:
- Nothing is written until every line has been read and checked: the entries go first to a
  spool (a temporary SQLite file, so memory stays constant however large the snapshot, and stdin
  works as well as a file), which also finds duplicated outputs and txids whose entries disagree
  on height or coinbase. A bad line is BadInput naming its line number.
- Entries created above the snapshot height are not part of it: skipped and counted.
- The store receives the snapshot in txid order, in batches that never split a transaction's
  outputs (the store makes one record per txid per call).
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from chain import hash_to_hex, hex_to_hash, is_data_carrier
from stores.utxo import TxExists, Utxo, UtxoStore
from stores.utxo.validate import MAX_VOUT
from workers.cli.app import BadInput, Context, cli, emit
from workers.cli.progress import Reporter
from workers.settings import mask_url

MAX_MONEY = 21_000_000 * 100_000_000
IMPORT_BATCH = 50_000
_SPOOL_ROWS = 10_000

Entry = tuple[bytes, int, int, bytes, int, int, int]  # txid, vout, sats, script, height, coinbase, line


def _int(obj: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key!r} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{key!r} must be in {lo}..{hi}, got {v}")
    return v


def parse_entry(text: str, default_height: int) -> tuple[bytes, int, int, bytes, int, bool]:
    """One JSON line → (txid, vout, satoshis, script, height, coinbase). ValueError says why not."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise ValueError("not a snapshot entry: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("txid", "vout", "script") if k not in obj]
    if "satoshis" not in obj and "value" not in obj:
        missing.append("satoshis")
    if missing:
        raise ValueError(f"missing {', '.join(repr(k) for k in missing)}")
    if not isinstance(obj["txid"], str):
        raise ValueError(f"'txid' must be a string, got {obj['txid']!r}")
    try:
        txid = hex_to_hash(obj["txid"])
    except ValueError as e:
        raise ValueError(f"'txid': {e}") from None
    vout = _int(obj, "vout", 0, MAX_VOUT)
    sats_key = "satoshis" if "satoshis" in obj else "value"
    sats = _int(obj, sats_key, 0, MAX_MONEY)
    if "satoshis" in obj and "value" in obj and obj["value"] != sats:
        raise ValueError(f"'satoshis' ({sats}) and 'value' ({obj['value']!r}) disagree")
    script_hex = obj["script"]
    if not isinstance(script_hex, str):
        raise ValueError(f"'script' must be a hex string, got {script_hex!r}")
    try:
        script = bytes.fromhex(script_hex)
    except ValueError:
        raise ValueError(f"'script' is not hex: {script_hex[:80]!r}") from None
    height = default_height if obj.get("height") is None else _int(obj, "height", 0, 2**31 - 1)
    coinbase = obj.get("coinbase", False)
    if coinbase is None:
        coinbase = False
    if not isinstance(coinbase, bool):
        raise ValueError(f"'coinbase' must be true or false, got {coinbase!r}")
    return txid, vout, sats, script, height, coinbase


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

    def load(self, stream: IO[bytes], height: int, advance: Callable[[int], None]) -> SpoolCounts:
        c = self.counts
        rows: list[Entry] = []
        self.db.execute("BEGIN")
        for lineno, raw in enumerate(stream, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BadInput(f"line {lineno}: not UTF-8 text") from None
            if not text.strip():
                continue
            try:
                txid, vout, sats, script, h, cb = parse_entry(text, height)
            except ValueError as e:
                raise BadInput(f"line {lineno}: {e}") from None
            c.lines += 1
            if h > height:
                c.skipped += 1
            else:
                c.entries += 1
                c.data_carriers += is_data_carrier(sats, script)
            rows.append((txid, vout, sats, script, h, int(cb), lineno))
            if len(rows) >= _SPOOL_ROWS:
                self._flush(rows, advance)
        self._flush(rows, advance)
        self.db.execute("COMMIT")
        self.db.execute("CREATE INDEX e_key ON e (txid, vout)")
        self._check()
        return c

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
            raise BadInput(f"line {dup[3]}: output {op} is listed twice (also on line {dup[2]})")
        odd = self.db.execute(
            "SELECT txid, MAX(line) FROM e GROUP BY txid "
            "HAVING COUNT(DISTINCT height) > 1 OR COUNT(DISTINCT coinbase) > 1 ORDER BY MAX(line) LIMIT 1"
        ).fetchone()
        if odd is not None:
            raise BadInput(
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


def ensure_empty(store: UtxoStore) -> None:
    """A snapshot seeds an empty store only."""
    where = mask_url(store.url)
    if store.block_height:
        raise BadInput(f"the store is not empty (it is at height {store.block_height}): {where}")
    if not store.is_empty():
        raise BadInput(f"the store is not empty (it holds records): {where}")


def write_snapshot(
    store: UtxoStore, batches: Iterable[list[Utxo]], advance: Callable[[int], None],
    height: int, block_hash: bytes,
) -> int:
    """One store call, so the import, the store's new height and the snapshot's block are
    all-or-nothing together; the entries stream through it."""

    def entries() -> Iterator[Utxo]:
        for batch in batches:
            yield from batch
            advance(len(batch))

    try:
        return store.import_utxos(entries(), height=height, block_hash=block_hash)
    except TxExists as e:
        raise BadInput(f"the store is not empty: {e}") from None


def import_snapshot(
    store: UtxoStore, stream: IO[bytes], height: int, block_hash: bytes, source: str, rep: Reporter
) -> tuple[int, SpoolCounts]:
    """Check, then write a snapshot at `height` into the (empty) store and set its height."""
    with tempfile.TemporaryDirectory(prefix="utxo-import-") as tmp:
        spool = Spool(Path(tmp))
        try:
            ensure_empty(store)
            with rep.step(f"checking {source}", None, "lines") as advance:
                counts = spool.load(stream, height, advance)
            if counts.entries == 0:
                raise BadInput(f"{source}: no entries at or below height {height}: nothing to import")
            with rep.step("importing UTXOs", counts.entries, "outputs") as advance:
                written = write_snapshot(store, spool.batches(height), advance, height, block_hash)
        finally:
            spool.close()
    return written, counts


@cli.command("import-utxos")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--height", type=click.IntRange(min=1), required=True, help="Height H of the snapshot block.")
@click.option("--block-hash", required=True, metavar="HASH", help="Hash of the snapshot block.")
@click.pass_obj
def import_utxos_cmd(obj: Context, file: str, height: int, block_hash: str) -> None:
    """Seed an empty store with a UTXO snapshot taken at block HASH (height H).

    FILE (or - for stdin) holds JSON lines {"txid","vout","satoshis" (or "value"),"script",
    "height","coinbase"}; a missing height is H, a missing coinbase false. Entries created above
    H are skipped and counted. Prints {"imported","skipped","data_carriers","height","block_hash"}:
    "imported" counts the outputs written, "data_carriers" the zero-satoshi OP_RETURN entries
    that never enter the UTXO set.
    """
    try:
        snapshot_block = hex_to_hash(block_hash)
    except ValueError as e:
        raise BadInput(f"--block-hash: {e}") from None
    store = obj.open_store()
    try:
        with Reporter() as rep:
            if file == "-":
                written, counts = import_snapshot(
                    store, sys.stdin.buffer, height, snapshot_block, "stdin", rep
                )
            else:
                with open(file, "rb") as f:
                    written, counts = import_snapshot(store, f, height, snapshot_block, file, rep)
    finally:
        store.close()
    emit({
        "imported": written,
        "skipped": counts.skipped,
        "data_carriers": counts.data_carriers,
        "height": height,
        "block_hash": block_hash.strip().lower(),
    })
