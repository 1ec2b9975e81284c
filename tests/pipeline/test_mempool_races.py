"""Mempool transactions racing the blocks that mine them, on real workers: every block
transaction is also sent as a mempool transaction, with rivals that double-spend one of its
inputs, by `utxo enqueue` into two workers of two pool processes each: the rivals and half the
copies first, then the blocks and the other half at once. On Aerospike this is where a refused
delivery's take-back can land after a block's spend of the same transaction (there is no
transaction across records: `stores/utxo/aerospike/rules.py`). Whatever the order, the end is
the chain's: the confirmed set is the model's, each block transaction is mined and holds every
input it spends, and no rival holds anything (refused, or made conflicting with its spends
released)."""

from __future__ import annotations

import random

import pytest

from chain import Tx
from tests.pipeline.chains import confirmed_model, funding, outpoints, spend
from tests.pipeline.workers import Pipeline, any_pipeline_fixture, pipeline_fixture  # noqa: F401

pytestmark = pytest.mark.timeout(300)
BLOCKS, PER_BLOCK = 5, 12


def chain_with_rivals(
    rng: random.Random, base: set[tuple[bytes, int]], funds: list[Tx]
) -> tuple[list[list[Tx]], list[Tx]]:
    """BLOCKS blocks of PER_BLOCK transactions spending confirmed outputs (one or two inputs,
    often a block's own earlier outputs), and a rival for about every third transaction."""
    by_id = {t.txid: t for t in funds}
    unspent = sorted(base)
    blocks: list[list[Tx]] = []
    rivals: list[Tx] = []
    for _ in range(BLOCKS):
        txs: list[Tx] = []
        for _ in range(PER_BLOCK):
            ins = [unspent.pop(rng.randrange(len(unspent))) for _ in range(rng.choice((1, 2)))]
            tx = spend(*((by_id[t], v) for t, v in ins), n_outputs=2)
            txs.append(tx)
            by_id[tx.txid] = tx
            unspent += [(tx.txid, 0), (tx.txid, 1)]
            if rng.random() < 0.35:
                t, v = rng.choice(ins)
                rivals.append(spend((by_id[t], v), fee=3000 + len(rivals)))
        blocks.append(txs)
    return blocks, rivals


# one seed by default; four more in the slow set
@pytest.mark.parametrize("seed", [1, *(pytest.param(k, marks=pytest.mark.slow) for k in range(2, 6))])
def test_mempool_copies_and_rivals_racing_their_blocks(any_pipeline: Pipeline, seed: int) -> None:
    pipeline = any_pipeline
    rng = random.Random(seed)
    funds = funding(30, n_outputs=2)
    chain = pipeline.seed(funds)
    base = outpoints(funds)
    blocks, rivals = chain_with_rivals(rng, base, funds)
    for txs in blocks:
        chain.add(txs)
    copies = [t for txs in blocks for t in txs]
    rng.shuffle(copies)
    early = rivals + copies[: len(copies) // 2]  # the rivals get there first, mostly
    rng.shuffle(early)
    for name in ("w1", "w2"):
        pipeline.start_worker(name, concurrency=2)
    first = pipeline.enqueue_start("tx", [t.raw for t in early])
    assert first.wait(timeout=120) == 0
    sending = [pipeline.enqueue_start("block", chain.blocks[-BLOCKS:]),
               pipeline.enqueue_start("tx", [t.raw for t in copies[len(copies) // 2 :]])]
    for p in sending:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    pipeline.wait(timeout=180, refused=None)  # (rivals that lose a race are refused: how many varies)

    assert pipeline.tip()["height"] == 1000 + BLOCKS
    model = confirmed_model(chain.txs, base)
    assert pipeline.confirmed() == model
    store = pipeline.open_utxo()
    try:
        mined = [t for txs in blocks for t in txs]
        assert store.mined([t.txid for t in mined]) == {t.txid for t in mined}
        ops = [(i.prev_txid, i.prev_vout) for t in mined for i in t.inputs]
        outs = store.get_outputs(ops)
        holders = {op: o.spending_txid for op, o in outs.items()}
        assert holders == {(i.prev_txid, i.prev_vout): t.txid for t in mined for i in t.inputs}
        stored = store.existing([r.txid for r in rivals])
        for r in rivals:
            assert r.txid not in stored or store.get(r.txid, ["conflicting"]).conflicting, "a rival stands"
        # nothing unmined and not conflicting holds or adds an output
        assert {(u.txid, u.vout) for u in store.iter_utxos(confirmed=False)} == model
    finally:
        store.close()
