"""Blocks indexed out of order at the very start of a chain (several workers race on the first
blocks): the late parent of the block taken as the base becomes the base, and the chain is
applied again, in order, from it."""

from __future__ import annotations

from chain import parse_block
from stores.state import BlockStatus
from tests.pipeline.chains import Chain, confirmed_model, spend
from workers.sequencer import Sequencer


def test_the_base_s_late_parent_becomes_the_base(seq: Sequencer) -> None:
    c = Chain()
    for _ in range(101):
        c.add()
    c.add([spend((c.txs[0][0], 0))])  # spends the coinbase of the first block
    for raw in c.blocks[1:5]:  # block 1 is late: block 2 is taken as the base and applied
        seq.submit(raw)
    assert seq.state.tip().height == 5  # type: ignore[union-attr]
    for raw in [c.blocks[0], *c.blocks[5:]]:
        seq.submit(raw)
    first = seq.state.get_block(parse_block(c.blocks[0]).hash)
    assert first is not None and (first.height, first.status) == (1, BlockStatus.APPLIED)
    tip = seq.state.tip()
    assert tip is not None and tip.height == 102 and tip.hash == c.parent
    assert {(u.txid, u.vout) for u in seq.utxo.iter_utxos()} == confirmed_model(c.txs)
