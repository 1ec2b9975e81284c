"""Blocks prepared ahead of the chain by real `utxo worker` processes (`workers.chainstate.prepare`): the
worker that does not hold the chain prepares the blocks' commitment deltas, the holder takes
them, and a worker killed (SIGKILL) in the middle of preparing leaves nothing behind that the
chain needs — its lease is taken over, and every block's commitment is still the model's."""

from __future__ import annotations

import os
import signal

import pytest

from chain import Tx, parse_block
from tests.pipeline.chains import (
    SNAPSHOT_HEIGHT,
    Chain,
    commitment_model,
    funding,
    outpoints,
    snapshot_utxos,
    spend,
)
from tests.pipeline.test_faults import FUNDS_OUTPUTS, check_complete, owner
from tests.pipeline.workers import Pipeline, pipeline_fixture, until  # noqa: F401  (the fixture)
from workers.chainstate.commitment import muhash_hex
from workers.chainstate.prepare import LEASE


def chain_of(pipeline: Pipeline, n_blocks: int, n_txs: int) -> tuple[Chain, list[Tx]]:
    """A seeded store and `n_blocks` blocks of `n_txs` one-input transactions (as test_faults'
    big_chain), with the snapshot's transactions."""
    funds = funding(-(-n_blocks * n_txs // FUNDS_OUTPUTS), n_outputs=FUNDS_OUTPUTS)
    chain = pipeline.seed(funds)
    outs = [(f, v) for f in funds for v in range(FUNDS_OUTPUTS)]
    for b in range(n_blocks):
        chain.add([spend(o) for o in outs[b * n_txs : (b + 1) * n_txs]])
    return chain, funds


def check_commitments(pipeline: Pipeline, chain: Chain, funds: list[Tx]) -> None:
    """Every applied block's commitment is the model's, computed from the blocks alone."""
    state = pipeline.open_state()
    base = snapshot_utxos(funds, SNAPSHOT_HEIGHT)
    try:
        for k, raw in enumerate(chain.blocks):
            c = state.get_commitment(parse_block(raw).hash)
            assert c is not None, k
            want = commitment_model(chain.txs[: k + 1], SNAPSHOT_HEIGHT + 1, base)
            assert (muhash_hex(c), c.utxos, c.satoshis) == want, k
    finally:
        state.close()


@pytest.mark.timeout(180)
def test_a_worker_killed_while_it_prepares_blocks_ahead_leaves_the_chain_right(pipeline: Pipeline) -> None:
    chain, funds = chain_of(pipeline, 8, 2_000)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    enqueue = pipeline.enqueue_start("block", chain.blocks)
    state = pipeline.open_state()
    try:  # the prepare lease is held only while a worker walks the blocks ahead: kill it there
        holder = until(lambda: state.lease_holder(LEASE), 60, 0.002, "a worker preparing blocks ahead")
    finally:
        state.close()
    pid = int(holder.split(":")[1])
    victim = owner(pipeline, pid)
    os.kill(pid, signal.SIGKILL)
    enqueue.communicate(timeout=60)
    assert enqueue.returncode == 0
    check_complete(pipeline, chain, outpoints(funds))
    check_commitments(pipeline, chain, funds)
    assert pipeline.workers[victim].poll() is None, "the worker whose child was killed lives on"
