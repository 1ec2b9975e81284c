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
