"""`utxo invalidate HASH` and `utxo reconsider HASH`: an operator's verdicts on a block, as Bitcoin
Core's invalidateblock and reconsiderblock (the runbook: docs/operations.md, "A block wrongly
refused").

Invariants:
- Each verdict is carried out under the chain's lease (`Sequencer.invalidate`, `.reconsider`),
  so it never interleaves with a worker applying the chain; the command waits for the lease up
  to `--wait` seconds, and a chain still held then is exit 1 with nothing changed.
- Afterwards, when the best chain is no longer the applied one, a message for the best
  candidate is enqueued (registered as pending, as `utxo enqueue` does): a worker applies the
  new best chain, and `utxo wait` waits for it.
- Bad input (an unknown hash, a block that cannot be invalidated, a body missing) is exit 2 with
  one line, and nothing changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from chain import hex_to_hash
from workers.cli.app import BadInput, Context, NotFound, cli, emit
from workers.cli.pipeline import _export

OPERATOR = "invalidated by the operator (utxo invalidate)"


def _block_hash(text: str) -> bytes:
    try:
        return hex_to_hash(text)
    except ValueError as e:
        raise BadInput(f"HASH: {e}") from None


@contextmanager
def _refusing(block_hash: str, done: str, wait_s: float) -> Iterator[None]:
    """What a verdict's errors say (see the invariants): an unknown block or one that cannot be
    `done` is bad input; a chain held all along is exit 1."""
    from workers.chainstate.chainlease import ChainBusy

    try:
        yield
    except KeyError:
        raise BadInput(f"block {block_hash} is not known to the state store") from None
    except ValueError as e:
        raise BadInput(f"block {block_hash} cannot be {done}: {e}") from None
    except ChainBusy:
        raise NotFound(f"the chain's lease stayed held for {wait_s:g} s (a worker applying it): "
                       "nothing changed; try again") from None


def _then(obj: Context, svc: Any) -> dict[str, Any]:
    """Enqueue the best candidate when the chain is to move (see the invariants); where it
    stands."""
    from workers.runtime.ingest import BLOCK_TASK, send

    tip, best = svc.state.tip(), svc.state.best_candidate()
    out: dict[str, Any] = {"tip": None if tip is None else tip.to_json()}
    if best is not None and (tip is None or best.hash != tip.hash):
        obj.broker_url("; the verdict stands, nothing was enqueued (utxo enqueue the block to go on)")
        hexed = best.hash[::-1].hex()
        send(BLOCK_TASK, hexed, f"block:{hexed}", svc, best.height)
        out["enqueued"] = best.to_json()
    return out


@cli.command("invalidate")
@click.argument("block_hash", metavar="HASH")
@click.option("--reason", default=OPERATOR, show_default=True, help="Why, as `utxo block` will say.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to wait for the chain's lease.")
@click.pass_obj
def invalidate_cmd(obj: Context, block_hash: str, reason: str, wait_s: float) -> None:
    """Refuse block HASH and its descendants (Bitcoin Core's invalidateblock). An applied block
    is first taken off the chain with every block above it; the heaviest valid branch is then
    enqueued for the workers to apply. Prints {"block", "tip", "enqueued"?}."""
    from workers.runtime.services import services

    h = _block_hash(block_hash)
    _export(obj)
    svc = services()
    with _refusing(block_hash, "invalidated", wait_s):
        entry = svc.sequencer.invalidate(h, reason.strip() or OPERATOR, wait_s)
    emit({"block": entry.to_json(), **_then(obj, svc)})


@cli.command("reconsider")
@click.argument("block_hash", metavar="HASH")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to wait for the chain's lease.")
@click.pass_obj
def reconsider_cmd(obj: Context, block_hash: str, wait_s: float) -> None:
    """Clear block HASH of its verdict (Bitcoin Core's reconsiderblock): it, its invalid
    ancestors and their invalid descendants are placed again, to be checked again when they
    are applied; the best chain is then enqueued for the workers. Prints {"placed", "tip",
    "enqueued"?}; "placed" is empty when the block was not invalid."""
    from workers.chainstate.blockindex import BlockMissing
    from workers.runtime.services import services

    h = _block_hash(block_hash)
    _export(obj)
    svc = services()
    try:
        with _refusing(block_hash, "reconsidered", wait_s):
            placed = svc.sequencer.reconsider(h, wait_s)
    except BlockMissing as e:  # (a StorageError: through `_refusing` untouched)
        raise BadInput(f"block {e.block_hash[::-1].hex()}'s bytes are not in the blob store (pruned?): "
                       "utxo enqueue it again first; nothing changed") from None
    emit({"placed": [b.to_json() for b in placed], **_then(obj, svc)})
