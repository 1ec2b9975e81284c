"""`utxo import-utxos`: seed an empty store with a UTXO snapshot taken at a block.

Invariants:
- A snapshot file may begin with a header line, {"snapshot": {"height","block_hash","muhash",
  "utxos","satoshis"}} (`Header`: `utxo export-utxos` writes it), which names the block (then
  --height and --block-hash may be left out; given too, they must agree) and commits to the set.
- Nothing is written until every line has been read and checked: the entries go first to a
  spool (a temporary SQLite file, so memory stays constant however large the snapshot, and stdin
  works as well as a file), which also finds duplicated outputs and txids whose entries disagree
  on height or coinbase. A bad line is BadInput naming its line number.
- Entries created above the snapshot height are not part of it: skipped and counted.
- With a header, the commitment of what would be imported (the entries at or below the height
  that are not data carriers: `workers.chainstate.commitment`) is computed in the spool's pass and must be
  the header's (MuHash, outputs, satoshis) before the first write; else BadInput names both.
- The store receives the snapshot in txid order, in batches that never split a transaction's
  outputs (the store makes one record per txid per call).
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from chain import hash_to_hex, hex_to_hash, is_data_carrier
from stores.state import Commitment
from stores.utxo import TxExists, Utxo, UtxoStore
from stores.utxo.validate import MAX_VOUT
from workers.cli.app import BadInput, Context, cli, emit
from workers.cli.progress import Reporter
from workers.settings import mask_url

MAX_MONEY = 21_000_000 * 100_000_000
MAX_COUNT = 2**63 - 1  # a header's outputs and satoshis: what an SQL bigint holds
IMPORT_BATCH = 50_000
_SPOOL_ROWS = 10_000
HEADER_KEYS = ("height", "block_hash", "muhash", "utxos", "satoshis")

Entry = tuple[bytes, int, int, bytes, int, int, int]  # txid, vout, sats, script, height, coinbase, line


def _int(obj: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key!r} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{key!r} must be in {lo}..{hi}, got {v}")
    return v


@dataclass(frozen=True, slots=True)
class Header:
    """A snapshot file's first line (`utxo export-utxos` writes it): the block the set was taken
    at, and the set's commitment as the chain kept it for that block."""

    height: int
    block_hash: bytes  # internal order
    muhash: str  # as Bitcoin Core prints it: 64 lower-case hex digits
    utxos: int
    satoshis: int

    def line(self) -> str:
        body = {
            "height": self.height, "block_hash": hash_to_hex(self.block_hash), "muhash": self.muhash,
            "utxos": self.utxos, "satoshis": self.satoshis,
        }
        return json.dumps({"snapshot": body}) + "\n"

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Header:
        """The header of a first line's object (one with a "snapshot" key); ValueError says why not.
        Strict: a key it does not know might be a promise it cannot check."""
        others = set(obj) - {"snapshot"}
        if others:
            raise ValueError(f"a snapshot header holds 'snapshot' only, not also {_keys(others)}")
        body = obj["snapshot"]
        if not isinstance(body, dict):
            raise ValueError(f"'snapshot' must be an object, got {body!r}")
        missing = [k for k in HEADER_KEYS if k not in body]
        if missing:
            raise ValueError(f"'snapshot' is missing {_keys(missing)}")
        if set(body) - set(HEADER_KEYS):
            raise ValueError(f"'snapshot' holds unknown {_keys(set(body) - set(HEADER_KEYS))}")
        block_hash, muhash = body["block_hash"], body["muhash"]
        if not isinstance(block_hash, str):
            raise ValueError(f"'block_hash' must be a string, got {block_hash!r}")
        try:
            block = hex_to_hash(block_hash)
        except ValueError as e:
            raise ValueError(f"'block_hash': {e}") from None
        if not isinstance(muhash, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", muhash):
            raise ValueError(f"'muhash' must be 64 hex digits, got {muhash!r}")
        return cls(
            _int(body, "height", 1, 2**31 - 1), block, muhash.lower(),
            _int(body, "utxos", 0, MAX_COUNT), _int(body, "satoshis", 0, MAX_COUNT),
        )


def _keys(keys: Iterable[str]) -> str:
    return ", ".join(repr(k) for k in sorted(keys))


def read_header(first: bytes) -> Header | None:
    """The header on a file's first line, or None when that line is not one (an entry, or
    something the entries' checks will name)."""
    try:
        obj = json.loads(first)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return None
    if not isinstance(obj, dict) or "snapshot" not in obj:
        return None
    try:
        return Header.from_json(obj)
    except ValueError as e:
        raise BadInput(f"line 1: {e}") from None


def snapshot_block(header: Header | None, height: int | None, block_hash: bytes | None) -> tuple[int, bytes]:
    """(height, hash) of the snapshot's block: the header's, which the options must agree with,
    or, without a header, the options'."""
    if header is None:
        if height is None or block_hash is None:
            missing = [name for name, v in (("--height", height), ("--block-hash", block_hash)) if v is None]
            raise BadInput(f"{' and '.join(missing)} needed: the file has no snapshot header (a first "
                           'line {"snapshot": ...} as export-utxos writes) to name the block')
        return height, block_hash
    if height is not None and height != header.height:
        raise BadInput(f"--height {height} disagrees with the snapshot header's height {header.height}")
    if block_hash is not None and block_hash != header.block_hash:
        raise BadInput(f"--block-hash {hash_to_hex(block_hash)} disagrees with the snapshot header's "
                       f"block_hash {hash_to_hex(header.block_hash)}")
    return header.height, header.block_hash


def check_header(header: Header, found: Commitment, source: str) -> None:
    """BadInput naming each value of the header the entries do not give."""
    from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)

    muhash = commitment.muhash_hex(found)
    wrong = [
        f"{what} {got} found, {want} expected" for what, got, want in (
            ("utxos", found.utxos, header.utxos), ("satoshis", found.satoshis, header.satoshis),
            ("muhash", muhash, header.muhash),
        ) if got != want
    ]
    if wrong:
        raise BadInput(f"{source}: the entries do not match the snapshot header: {'; '.join(wrong)}: "
                       "nothing was imported")


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
    if "snapshot" in obj:
        raise ValueError("a snapshot header belongs on the first line only")
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
    store: UtxoStore, lines: Iterable[bytes], height: int, block_hash: bytes, source: str, rep: Reporter,
    header: Header | None = None, first_line: int = 1,
) -> tuple[int, SpoolCounts, Commitment]:
    """Check, then write a snapshot at `height` into the (empty) store and set its height; with
    a `header`, only once the entries' commitment is the header's. Returns what was written, the
    counts, and the commitment of the set imported."""
    with tempfile.TemporaryDirectory(prefix="utxo-import-") as tmp:
        spool = Spool(Path(tmp))
        try:
            ensure_empty(store)
            with rep.step(f"checking {source}", None, "lines") as advance:
                found = spool.load(lines, height, advance, first_line, hashed=True)
                assert found is not None
                if header is not None:  # within the step: its error alone is on stderr, no step line
                    check_header(header, found, source)
            counts = spool.counts
            if counts.entries == 0:
                raise BadInput(f"{source}: no entries at or below height {height}: nothing to import")
            with rep.step("importing UTXOs", counts.entries, "outputs") as advance:
                written = write_snapshot(store, spool.batches(height), advance, height, block_hash)
        finally:
            spool.close()
    return written, counts, found


@cli.command("import-utxos")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--height", type=click.IntRange(min=1), help="Height H of the snapshot block.")
@click.option("--block-hash", metavar="HASH", help="Hash of the snapshot block.")
@click.pass_obj
def import_utxos_cmd(obj: Context, file: str, height: int | None, block_hash: str | None) -> None:
    """Seed an empty store with a UTXO snapshot taken at block HASH (height H).

    FILE (or - for stdin) holds JSON lines {"txid","vout","satoshis" (or "value"),"script",
    "height","coinbase"}; a missing height is H, a missing coinbase false. Entries created above
    H are skipped and counted. The first line may be a header {"snapshot": {"height",
    "block_hash","muhash","utxos","satoshis"}}, as export-utxos writes: it names the block
    (--height and --block-hash are then optional, and must agree with it if given), and nothing
    is imported unless the entries' MuHash, outputs and satoshis are the header's. Without a
    header, --height and --block-hash are required. Prints {"imported","skipped",
    "data_carriers","height","block_hash","muhash"}: "imported" counts the outputs written,
    "data_carriers" the zero-satoshi OP_RETURN entries that never enter the UTXO set, "muhash"
    the set's commitment (kept in the state store for the snapshot's block).
    """
    from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)
    from workers.chainstate.blockindex import seed_from_snapshot
    from workers.chainstate.pairing import apart

    given: bytes | None = None
    if block_hash is not None:
        try:
            given = hex_to_hash(block_hash)
        except ValueError as e:
            raise BadInput(f"--block-hash: {e}") from None
    with ExitStack() as files:
        stream: IO[bytes] = sys.stdin.buffer if file == "-" else files.enter_context(open(file, "rb"))
        source = "stdin" if file == "-" else file
        # The first line says whether the options are needed: read before a store is opened
        # (or made).
        first = stream.readline()
        header = read_header(first)
        at_height, at_block = snapshot_block(header, height, given)
        lines: Iterable[bytes] = stream if header is not None else itertools.chain([first], stream)
        store = files.enter_context(closing(obj.open_store()))
        state = files.enter_context(closing(obj.open_state()))
        problem = apart(state, store)  # (a state store of a chain elsewhere: nothing written)
        if problem is not None:
            raise BadInput(problem)
        with Reporter() as rep:
            written, counts, made = import_snapshot(
                store, lines, at_height, at_block, source, rep, header, 2 if header is not None else 1
            )
        # The snapshot block's commitment, for the first block applied on it (which would
        # otherwise compute it from the store, holding the chain meanwhile) and for `stats --hash
        # muhash`; the block itself as the chain's tip, so that `utxo tip` and `stats` tell it
        # at once; the two stores paired (`workers.chainstate.pairing`).
        state.commit(commitments={at_block: made})
        seed_from_snapshot(state, (at_height, at_block))
        problem = apart(state, store, pair=True)
        if problem is not None:
            raise BadInput(problem)
    out: dict[str, Any] = {
        "imported": written,
        "skipped": counts.skipped,
        "data_carriers": counts.data_carriers,
        "height": at_height,
        "block_hash": hash_to_hex(at_block),
    }
    out["muhash"] = commitment.muhash_hex(made)
    emit(out)
