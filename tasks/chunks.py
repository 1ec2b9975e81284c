"""Block-phase helper tasks (queue `txs`): run units of a block phase that its coordinator posted.

One task body under three names, so that Flower shows which phase a worker is helping with.
A helper that arrives after the phase is over finds nothing to claim and returns at once.
"""

from __future__ import annotations

from typing import Any

from workers.chainstate.fanout import help_with
from workers.runtime.app import app
from workers.runtime.services import services


def _help(block_hash: str, phase: str, run: str, ctx: dict[str, int]) -> dict[str, Any]:
    svc = services()
    svc.sequencer.blocks.passed(ctx["height"])  # the chain applies this block: those below are done
    ran = help_with(svc.state, svc.sequencer.applier, svc.sequencer.genuine, block_hash, phase, run, ctx,
                    ttl_s=svc.sequencer.lease_s)
    return {"hash": block_hash, "phase": phase, "units": ran}


@app.task(name="utxoflow.chunk.create")
def chunk_create(block_hash: str, phase: str, run: str, ctx: dict[str, int]) -> dict[str, Any]:
    """Create a block's new transactions (or pages of a multi-record one), a unit at a time."""
    return _help(block_hash, phase, run, ctx)


@app.task(name="utxoflow.chunk.spend")
def chunk_spend(block_hash: str, phase: str, run: str, ctx: dict[str, int]) -> dict[str, Any]:
    """Spend the inputs of a block's transactions, a unit at a time."""
    return _help(block_hash, phase, run, ctx)


@app.task(name="utxoflow.chunk.mine")
def chunk_mine(block_hash: str, phase: str, run: str, ctx: dict[str, int]) -> dict[str, Any]:
    """Mark a block's transactions mined in it, a unit at a time."""
    return _help(block_hash, phase, run, ctx)
