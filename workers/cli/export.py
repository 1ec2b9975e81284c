"""`utxo export-utxos`: the confirmed UTXO set as a snapshot file `utxo import-utxos` takes back.

Invariants:
- The file is one header line, {"snapshot": {"height","block_hash","muhash","utxos","satoshis"}}
  (`workers.snapshots.fileformat.Header`): the tip and the commitment the state store keeps
  for it, both read before anything else; then the confirmed set, one import-utxos line per
  output (`Utxo.json_line`).
- What is written is what the header says, or the export fails (BadInput, exit 2): the lines'
  commitment is computed as they are written (`commitment.of_utxos` over the stream, so memory
  stays bounded and the set is never held), and at the end the tip must be the same block and
  the computed commitment the kept one. The second check catches what the first cannot: a block
  being applied while the set was read, before the tip moved.
- A failed export leaves no FILE: the lines go to a temporary file in FILE's directory (one
  filesystem, so the rename is atomic), which becomes FILE only once the export is verified; a
  FILE that was there stays as it was until then. To stdout (`-`) the lines are out already:
  exit 2 says to discard them, and there is no summary.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import click

from chain import hash_to_hex
from stores.state import Commitment, StateStore
from stores.utxo import Utxo, UtxoStore
from workers.cli.app import BadInput, Context, NotFound, OutputClosed, cli, emit
from workers.cli.progress import Reporter
from workers.snapshots.fileformat import Header

_ADVANCE_EVERY = 10_000  # outputs between progress updates (an update per output costs more than its line)
_BUFFER = 1 << 20
MOVED = "the chain moved while exporting: stop the workers or wait, then export again"


def kept_commitment(state: StateStore) -> tuple[Header, Commitment]:
    """The header of the tip and the commitment kept for it: NotFound without a tip, BadInput
    without a commitment."""
    from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)

    tip = state.tip()
    if tip is None or tip.height is None:  # (an applied block always has its height)
        raise NotFound("no block has been applied yet: there is no confirmed set to export")
    kept = state.get_commitment(tip.hash)
    if kept is None:
        raise BadInput(f"the tip {hash_to_hex(tip.hash)} has no commitment (it was applied before "
                       "commitments were kept), so an export could not be verified: export once the "
                       "next block is applied")
    return Header(tip.height, tip.hash, commitment.muhash_hex(kept), kept.utxos, kept.satoshis), kept


def written(
    rows: Iterable[Utxo], write: Callable[[str], object], advance: Callable[[int], None]
) -> Iterator[Utxo]:
    """`rows`, each written as an import-utxos line as it goes by (to be hashed)."""
    n = 0
    for u in rows:
        write(u.json_line())
        yield u
        n += 1
        if n == _ADVANCE_EVERY:
            advance(n)
            n = 0
    advance(n)


def write_set(store: UtxoStore, out: IO[str], header: Header, advance: Callable[[int], None]) -> Commitment:
    """The header, then the store's confirmed set; the commitment of the lines written."""
    from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)

    out.write(header.line())
    rows = store.iter_utxos(confirmed=True)
    try:
        made = commitment.of_utxos(written(rows, out.write, advance))
    finally:
        close = getattr(rows, "close", None)  # a generator: release its cursor early
        if close is not None:
            close()
    out.flush()
    return made


def verify(state: StateStore, header: Header, kept: Commitment, made: Commitment) -> None:
    """BadInput unless the tip is still the header's block and what was written is its commitment."""
    from workers.chainstate import commitment  # (its MuHash's imports: only the commands that use it)

    after = state.tip()
    if after is None or after.hash != header.block_hash:
        raise BadInput(MOVED)
    if made != kept:
        raise BadInput(
            f"what was exported does not match the commitment of the tip {hash_to_hex(header.block_hash)}: "
            f"muhash {commitment.muhash_hex(made)} ({made.utxos} outputs, {made.satoshis} satoshis) "
            f"written, {commitment.muhash_hex(kept)} ({kept.utxos} outputs, {kept.satoshis} satoshis) "
            "kept (a block being applied meanwhile does this: stop the workers or wait, then export again)"
        )


@contextmanager
def replacing(path: Path) -> Iterator[IO[str]]:
    """A text file that becomes `path` if the block ends without an exception, and is removed
    if not. Made as `path` would be: mode 0666 less the umask."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise BadInput(f"FILE: cannot write in {path.parent}: {e.strerror or e}") from None
    try:
        with open(fd, "w", encoding="ascii", buffering=_BUFFER) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before it takes FILE's name
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def output(file: str) -> Iterator[IO[str]]:
    if file == "-":
        try:
            yield sys.stdout
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as `utxos` does
            raise OutputClosed() from None
    else:
        with replacing(Path(file)) as f:
            yield f


@cli.command("export-utxos")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.pass_obj
def export_utxos_cmd(obj: Context, file: str) -> None:
    """Write the confirmed UTXO set at the tip as a snapshot that import-utxos takes back.

    FILE (or - for stdout) gets a header line {"snapshot": {"height","block_hash","muhash",
    "utxos","satoshis"}}: the tip and its commitment (MuHash3072 as Bitcoin Core's gettxoutsetinfo
    prints it). Then one JSON line per output {"txid","vout","satoshis","script","height",
    "coinbase"}. The lines are hashed as they are written: if the chain moved meanwhile, or the
    hash is not the tip's, the export fails (exit 2) and leaves no FILE. Prints {"file","height",
    "block_hash","muhash","utxos","satoshis"} (not with -). Stop the workers, or export while
    no block arrives.
    """
    state = obj.open_state(create=False)
    try:
        header, kept = kept_commitment(state)
        store = obj.open_store(create=False)
        try:
            with Reporter() as rep, output(file) as out:
                # verified within the step, so that a failed export logs no step line but its
                # error, and within `output`, so that it leaves no FILE
                with rep.step("exporting UTXOs", header.utxos, "outputs") as advance:
                    made = write_set(store, out, header, advance)
                    verify(state, header, kept, made)
        finally:
            store.close()
    finally:
        state.close()
    if file != "-":
        emit({
            "file": file, "height": header.height, "block_hash": hash_to_hex(header.block_hash),
            "muhash": header.muhash, "utxos": header.utxos, "satoshis": header.satoshis,
        })
