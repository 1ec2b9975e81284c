"""Reorgs through real workers: a heavier branch three blocks deep (one tx mined again, one
double-spent, the double spend's child in the same block), then back again, on SQLite,
PostgreSQL and Aerospike; random block trees; a refused block; all against the independent model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from chain import Tx, parse_block
from tests.pipeline.chains import (
    Chain,
    confirmed_model,
    funding,
    outpoints,
    spend,
)
from tests.pipeline.trees import Tree, check_store, make_tree
from tests.pipeline.workers import Pipeline, any_pipeline_fixture, pipeline_fixture  # noqa: F401  (fixtures)

BAD_LOG_LINES = ("given up", "Traceback", "invalid", "refused")


@dataclass
class Story:
    """The issue's story: a chain A of four blocks, w, x, y, then y's child yc; a heavier branch
    B from A's first block (three back) that mines x again and double-spends y's input (y2,
    with its child y2c in the same block), one block longer; then A grows past B, spending
    yc. `a` holds A's blocks to the fork plus its own."""

    base: set[tuple[bytes, int]]
    a: Chain
    b: Chain
    a_more: list[bytes]
    y: Tx
    yc: Tx
    y2: Tx
    y2c: Tx


def story(pipeline: Pipeline) -> Story:
    funds = funding(4)
    a = pipeline.seed(funds)
    w, x, y = spend((funds[0], 0)), spend((funds[1], 0)), spend((funds[2], 0), n_outputs=2)
    yc = spend((y, 1))
    y2 = spend((funds[2], 0), fee=2000)
    y2c = spend((y2, 0))
    a.add([w])
    b = a.fork(0)
    a.add([x])
    a.add([y])
    a.add([yc])
    b.add([x, y2, y2c])
    b.add()
    b.add([spend((funds[3], 0))])
    b.add()  # B: 5 blocks, A: 4
    a_more = [a.add([spend((yc, 0))]), a.add()]  # A: 6 blocks
    a.blocks, a.txs = a.blocks[:4], a.txs[:4]  # what A has before B arrives
    return Story(outpoints(funds), a, b, a_more, y, yc, y2, y2c)


def check_branch(pipeline: Pipeline, chain: Chain, base: set[tuple[bytes, int]]) -> None:
    assert tip_hash(pipeline) == parse_block(chain.blocks[-1]).hash[::-1].hex(), pipeline.logs()
    assert pipeline.confirmed() == confirmed_model(chain.txs, base)


def seed_tree(pipeline: Pipeline, tree: Tree) -> None:
    utxo = pipeline.open_utxo()
    try:
        tree.seed(utxo)
    finally:
        utxo.close()


def check_tree(pipeline: Pipeline, tree: Tree) -> None:
    """The pipeline's stores hold what the tree's model says (`trees.check_store`)."""
    utxo, state = pipeline.open_utxo(), pipeline.open_state()
    try:
        check_store(tree, utxo, state)
    finally:
        utxo.close()
        state.close()


def conflicting(pipeline: Pipeline, *txs: Tx) -> list[bool]:
    return [pipeline.tx(t.txid_hex)["conflicting"] for t in txs]  # type: ignore[index]


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


@pytest.mark.timeout(240)
def test_the_heavier_branch_wins_and_loses_again(any_pipeline: Pipeline) -> None:
    """The issue's story with two workers: B wins (y and yc conflicting, x mined in B), then A
    wins again (y and yc made whole and spent on, y2 and y2c conflicting); no block refused or
    marked invalid, nothing given up, no traceback in any log."""
    pipeline = any_pipeline
    s = story(pipeline)
    pipeline.start_worker("w1")
    pipeline.start_worker("w2")
    pipeline.enqueue("block", s.a.blocks)
    pipeline.wait()
    check_branch(pipeline, s.a, s.base)
    pipeline.enqueue("block", s.b.blocks[1:])
    pipeline.wait()
    check_branch(pipeline, s.b, s.base)
    assert conflicting(pipeline, s.y, s.yc, s.y2, s.y2c) == [True, True, False, False]
    pipeline.enqueue("block", s.a_more)
    pipeline.wait()
    s.a.blocks += s.a_more
    s.a.txs += [parse_block(r).txs for r in s.a_more]
    check_branch(pipeline, s.a, s.base)
    assert conflicting(pipeline, s.y, s.yc, s.y2, s.y2c) == [False, False, True, True]
    assert pipeline.state_counts() == {"applied": 7, "side": 4}  # the snapshot's block, 6; B's 4
    logs = pipeline.logs()
    assert not [line for line in logs.splitlines() if any(b in line for b in BAD_LOG_LINES)], logs


@pytest.mark.parametrize("seed", [4, 9, 17])
@pytest.mark.timeout(300)
def test_random_trees_through_two_workers(seed: int, any_pipeline: Pipeline) -> None:
    """A random block tree (tests.pipeline.trees), enqueued in its random arrival order in three
    parts, two workers at concurrency 2 applying it: the stores end as the tree's model says."""
    pipeline = any_pipeline
    tree = make_tree(seed)
    seed_tree(pipeline, tree)
    pipeline.start_worker("w1", concurrency=2)
    pipeline.start_worker("w2", concurrency=2)
    for part in tree.parts():
        pipeline.enqueue("block", part)
    pipeline.wait(120)
    check_tree(pipeline, tree)
    logs = pipeline.logs()
    assert "Traceback" not in logs and "given up" not in logs, logs


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
    pipeline.wait(refused=1)
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
