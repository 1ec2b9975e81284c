"""Blocks indexed out of order at the very start of a chain (several workers race on the first
blocks): the late parent of the block taken as the base becomes the base, and the chain is
applied again, in order, from it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chain import iter_blk_records, parse_block
from stores.state import BlockStatus
from tests.pipeline.chains import Chain, confirmed, confirmed_model, spend
from workers.chainstate.sequencer import Sequencer


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


def test_mainnet_blocks_without_bip34_rebase_to_the_genesis_child_s_heights(
    seq: Sequencer, data_dir: Path
) -> None:
    """Early mainnet blocks have no BIP34 height: block 2 taken as the base gets height 0; its
    late parent, block 1, a child of the genesis, must be height 1 (not -1), and every block
    above moves up with it (regression: two workers on mainnet-1-255.blk)."""
    raws = [raw for _off, raw in iter_blk_records((data_dir / "mainnet-1-255.blk").read_bytes())]
    blocks = [parse_block(r) for r in raws]
    for raw in raws[1:4]:
        seq.submit(raw)
    assert seq.state.tip().height == 2  # type: ignore[union-attr]  (block 4 at 0 + 2)
    for raw in [raws[0], *raws[4:]]:
        seq.submit(raw)
    for h, b in ((1, blocks[0]), (2, blocks[1]), (4, blocks[3]), (255, blocks[-1])):
        e = seq.state.get_block(b.hash)
        assert e is not None and (e.height, e.status) == (h, BlockStatus.APPLIED), (h, e)
    assert seq.state.tip().hash == blocks[-1].hash  # type: ignore[union-attr]
    assert confirmed(seq.utxo) == confirmed_model([b.txs for b in blocks])
    coinbase = seq.utxo.get(blocks[1].txs[0].txid)  # made again at its right height
    assert list(coinbase.block_heights) == [2] and coinbase.spending_height == 102


def _coinbase_chain(n: int) -> Chain:
    c = Chain()
    for _ in range(n):
        c.add()  # a coinbase each (BIP34 heights 1…n)
    return c


def _check_ordered(seq: Sequencer, c: Chain) -> None:
    """What an ordered pass gives: every block applied at its height, the tip the last one,
    and the confirmed set every coinbase's outputs."""
    for k, raw in enumerate(c.blocks):
        e = seq.state.get_block(parse_block(raw).hash)
        assert e is not None and (e.height, e.status) == (k + 1, BlockStatus.APPLIED), (k, e)
    tip = seq.state.tip()
    assert tip is not None and tip.hash == c.parent and tip.height == len(c.blocks)
    assert confirmed(seq.utxo) == confirmed_model(c.txs)


def test_the_first_blocks_in_the_order_4_3_1_0_2(seq: Sequencer) -> None:
    """The order of the issue that left block 0 an orphan for good: 4, 3, 1, 0, 2, then the rest.
    Block 2's parent was indexed as an orphan, and the base is 3 then: the root of the base's
    ancestry (block 0) must become the base, whatever path made it known."""
    c = _coinbase_chain(12)
    for k in (4, 3, 1, 0, 2, *range(5, 12)):
        seq.submit(c.blocks[k])
    _check_ordered(seq, c)


@pytest.mark.parametrize("seed", range(6))
def test_any_arrival_order_at_the_start_finds_the_ordered_chain(seq: Sequencer, seed: int) -> None:
    c = _coinbase_chain(10)
    order = list(range(10))
    random.Random(seed).shuffle(order)
    for k in order:
        seq.submit(c.blocks[k])
    _check_ordered(seq, c)
