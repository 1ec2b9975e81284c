"""`utxo import-utxos`: seed an empty store with a UTXO snapshot taken at a block.

Invariants:
- A snapshot file's header (`workers.snapshots.fileformat.Header`), when it has one, names the
  block (then --height and --block-hash may be left out; given too, they must agree) and
  commits to the set.
- Nothing is written until every line has been read and checked (`workers.snapshots.spool`); a
  bad line is BadInput naming its line number.
- With a header, the commitment of what would be imported (the entries at or below the height
  that are not data carriers: `workers.chainstate.commitment`) is computed in the spool's pass
  and must be the header's (MuHash, outputs, satoshis) before the first write; else BadInput
  names both.
- The store receives the snapshot in one call (`import_utxos`), so the records, the store's new
  height and the snapshot's block are all-or-nothing together.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import IO, Any

import click

from chain import hash_to_hex, hex_to_hash
from stores.state import Commitment
from stores.utxo import TxExists, Utxo, UtxoStore
from workers.cli.app import BadInput, Context, cli, emit
from workers.cli.progress import Reporter
from workers.settings import mask_url
from workers.snapshots.fileformat import Header, SnapshotError, read_header
from workers.snapshots.spool import Spool, SpoolCounts


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
        try:  # (a line at fault: one line on stderr, exit 2)
            ensure_empty(store)
            with rep.step(f"checking {source}", None, "lines") as advance:
                try:
                    found = spool.load(lines, height, advance, first_line, hashed=True)
                except SnapshotError as e:
                    raise BadInput(str(e)) from None
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
        try:
            header = read_header(first)
        except SnapshotError as e:
            raise BadInput(str(e)) from None
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
