"""The chain sequencer over real stores (every backend), applying generated chains in-process."""

from __future__ import annotations

from chain import parse_block
from stores.state import BlockStatus
from tests.pipeline.chains import Chain, confirmed_model, spend
from workers.chainstate.sequencer import Sequencer


def confirmed(seq: Sequencer) -> set[tuple[bytes, int]]:
    return {(u.txid, u.vout) for u in seq.utxo.iter_utxos(confirmed=True)}


def test_a_linear_chain_with_parent_and_child_in_one_block(seq: Sequencer) -> None:
    c = Chain()
    c.add()
    first_cb = c.txs[0][0]
    for _ in range(100):  # the coinbase matures
        c.add()
    a = spend((first_cb, 0), n_outputs=3)
    b = spend((a, 1))  # parent and child in the same block
    c.add([a, b])
    for raw in c.blocks:
        seq.submit(raw)
    tip = seq.state.tip()
    assert tip is not None and tip.height == 102 and tip.hash == parse_block(c.blocks[-1]).hash
    assert confirmed(seq) == confirmed_model(c.txs)


def test_a_reorg_three_deep_and_back(seq: Sequencer) -> None:
    c = Chain()
    for _ in range(102):
        c.add()
    base = c.txs
    x = spend((base[0][0], 0), n_outputs=2)  # mined on the first branch, again on the second
    y = spend((base[1][0], 0))  # mined on the first branch only, double-spent on the second
    y2 = spend((base[1][0], 0), fee=2000)
    main = c.fork(len(c.blocks) - 1)
    main.add([x])
    main.add([y])
    main.add()
    for raw in main.blocks:
        seq.submit(raw)
    assert confirmed(seq) == confirmed_model(main.txs)
    side = c.fork(len(c.blocks) - 1)
    side.add([x])
    side.add([y2])
    side.add()
    side.add()  # heavier by one block
    for raw in side.blocks[-4:]:
        seq.submit(raw)
    assert seq.state.tip().hash == side.parent  # type: ignore[union-attr]
    assert confirmed(seq) == confirmed_model(side.txs)
    assert seq.utxo.get(y.txid, ["conflicting"]).conflicting
    assert seq.state.get_block(parse_block(main.blocks[-1]).hash).status is BlockStatus.SIDE  # type: ignore[union-attr]
    main.add()
    main.add()  # and back: the first branch is heavier again
    for raw in main.blocks[-2:]:
        seq.submit(raw)
    assert seq.state.tip().hash == main.parent  # type: ignore[union-attr]
    assert confirmed(seq) == confirmed_model(main.txs)
    assert not seq.utxo.get(y.txid, ["conflicting"]).conflicting
    assert seq.utxo.get(y2.txid, ["conflicting"]).conflicting
