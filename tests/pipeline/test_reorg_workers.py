"""A reorg through real workers: a heavier branch three blocks deep (one tx mined again, one
double-spent), then back again; and a refused block, all against the independent model."""

from __future__ import annotations

import pytest

from chain import parse_block
from tests.pipeline.chains import confirmed_model, funding, outpoints, spend
from tests.pipeline.workers import Pipeline, pipeline_fixture  # noqa: F401  (the fixture)


def tip_hash(pipeline: Pipeline) -> str:
    return str(pipeline.tip()["hash"])


@pytest.mark.timeout(240)
def test_a_reorg_three_deep_and_back_through_two_workers(pipeline: Pipeline) -> None:
    funds = funding(3)
    base = outpoints(funds)
    root = pipeline.seed(funds)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    x = spend((funds[0], 0))  # mined on both branches
    y = spend((funds[1], 0))  # mined on the first branch, double-spent on the second
    y2 = spend((funds[1], 0), fee=2000)
    main = root  # the first branch continues the snapshot; the second starts there too
    side = type(root)(root.parent, root.height)
    main.add([x])
    main.add([y])
    main.add()
    pipeline.enqueue("block", main.blocks)
    pipeline.wait()
    assert pipeline.confirmed() == confirmed_model(main.txs, base)

    side.add([x])
    side.add([y2])
    side.add()
    side.add()  # one block more than the first branch: heavier
    pipeline.enqueue("block", side.blocks)
    pipeline.wait()
    assert tip_hash(pipeline) == parse_block(side.blocks[-1]).hash[::-1].hex()
    assert pipeline.confirmed() == confirmed_model(side.txs, base)
    assert pipeline.tx(y.txid_hex)["conflicting"] is True  # type: ignore[index]

    main.add()
    main.add()  # and back: the first branch is heavier again
    pipeline.enqueue("block", main.blocks[-2:])
    pipeline.wait()
    assert tip_hash(pipeline) == parse_block(main.blocks[-1]).hash[::-1].hex()
    assert pipeline.confirmed() == confirmed_model(main.txs, base)
    assert pipeline.tx(y.txid_hex)["conflicting"] is False  # type: ignore[index]
    assert pipeline.tx(y2.txid_hex)["conflicting"] is True  # type: ignore[index]
    counts = pipeline.state_counts()
    assert counts == {"applied": 6, "side": 4}, counts  # the snapshot's block, 5 + 4 side


@pytest.mark.timeout(120)
def test_a_refused_block_through_workers_leaves_the_tip(pipeline: Pipeline) -> None:
    funds = funding(2)
    base = outpoints(funds)
    chain = pipeline.seed(funds)
    pipeline.start_worker("w1")
    a = spend((funds[0], 0))
    chain.add([a])
    bad = chain.next_block([spend((funds[0], 0), fee=7)])  # spends what `a` spent: refused
    pipeline.enqueue("block", [*chain.blocks, bad])
    pipeline.wait()
    assert tip_hash(pipeline) == parse_block(chain.blocks[-1]).hash[::-1].hex()
    r = pipeline.utxo("block", parse_block(bad).hash[::-1].hex())
    assert r.returncode == 0 and '"status": "invalid"' in r.stdout and "already spent" in r.stdout, r.stdout
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)


@pytest.mark.timeout(240)
def test_a_tx_of_more_than_20000_outputs_at_the_default_batch_size(pipeline: Pipeline) -> None:
    """Two-phase creation inside a block applied by a worker: three records at 20,000 outputs
    each; outputs on the first and last pages are spent in the next block."""
    pipeline.env["UTXO_BATCH_SIZE"] = "20000"
    funds = funding(1, satoshis=10**10)
    base = outpoints(funds)
    chain = pipeline.seed(funds)
    pipeline.start_worker("w1")
    big = spend((funds[0], 0), n_outputs=40_001, fee=10**5)
    chain.add([big])
    chain.add([spend((big, 0), (big, 20_000), (big, 40_000))])
    pipeline.enqueue("block", chain.blocks)
    pipeline.wait(120)
    assert tip_hash(pipeline) == parse_block(chain.blocks[-1]).hash[::-1].hex()
    meta = pipeline.tx(big.txid_hex)
    assert meta is not None
    assert (meta["total_extra_recs"], meta["external"], meta["creating"]) == (2, True, False)
    assert meta["spent_utxos"] == 3
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)
