"""Blocks prepared ahead of the chain (`workers.prepare`): a second sequencer on the same stores
prepares the commitment deltas of the blocks above the tip while the first applies them, in
every interleaving; the commitment of every block must equal the model's, computed from the
blocks alone, and the holder must really take the prepared deltas (a planted one shows it).
Reorgs, a rebase-free epoch bump in the middle of a read, and a basis that no longer holds."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaingen import generate
from chain import parse_block
from chain.muhash import MuHash
from stores.blob import open_blob_store
from stores.state import BlockStatus, PreparedDelta, open_state_store
from stores.utxo import open_utxo_store
from tests.pipeline.chains import commitment_model, spend
from tests.pipeline.world import World
from workers.commitment import muhash_hex
from workers.prepare import EPOCH, basis
from workers.sequencer import ChainBusy, Sequencer


@pytest.fixture
def other(urls: tuple[str, str], tmp_path: Path) -> Iterator[Sequencer]:
    """A second worker's sequencer on the fixture's stores."""
    blobs = f"file://{tmp_path}/blobs"
    s = Sequencer(open_utxo_store(urls[0], blob_url=blobs), open_state_store(urls[1]), open_blob_store(blobs))
    yield s
    s.utxo.close()
    s.state.close()


def _advance(seq: Sequencer) -> None:
    while True:
        try:
            seq.advance()
            return
        except ChainBusy:  # (the other holds it for a moment: never here, all in one thread)
            continue


def _check_every_commitment(seq: Sequencer, txs: list[list], first_height: int) -> None:
    tip = seq.state.tip()
    assert tip is not None
    e = tip
    k = len(txs)
    while k > 0:  # every applied block's commitment, the tip's first
        made = seq.state.get_commitment(e.hash)
        assert made is not None
        assert (muhash_hex(made), made.utxos, made.satoshis) == commitment_model(txs[:k], first_height), e
        k -= 1
        p = seq.state.get_block(e.parent)
        assert p is not None or k == 0
        e = p  # type: ignore[assignment]


def test_prepared_deltas_give_every_block_the_models_commitment_in_any_interleaving(
    seq: Sequencer, other: Sequencer
) -> None:
    chain = generate(8, 60, fan_blocks=2, seed=5)  # spends across the set, in-block children
    rng = random.Random(17)
    blocks = [parse_block(raw) for raw in chain.raws]
    taken = made = 0
    i = 0
    while i < len(blocks):
        n = rng.randrange(1, 6)
        for raw, b in zip(chain.raws[i : i + n], blocks[i : i + n]):  # a few more arrive, indexed
            other.store_block(raw)
            assert other.accept(b) is not None
        i += n
        if rng.random() < 0.7:
            made += other.prepare_ahead(budget_s=30)
        before = _count_prepared(seq)
        if rng.random() < 0.8:
            _advance(seq)
        taken += _count_prepared(seq) - before
    made += other.prepare_ahead(budget_s=30)
    _advance(seq)
    tip = seq.state.tip()
    assert tip is not None and tip.hash == chain.tip_hash
    txs = [parse_block(raw).txs for raw in chain.raws]
    _check_every_commitment(seq, txs, 1)
    assert made >= 20 and taken >= 10  # most blocks were prepared ahead and taken … none left
    print(f"deltas made {made}, taken {taken} of {len(blocks)} blocks")
    assert all(seq.state.get_delta(b.hash) is None for b in blocks)


def _count_prepared(seq: Sequencer) -> int:
    from workers.ops.metrics import BLOCKS_PREPARED

    return int(BLOCKS_PREPARED.labels("taken")._value.get())


def test_the_holder_takes_a_prepared_delta_and_only_where_its_basis_holds(
    seq: Sequencer, other: Sequencer
) -> None:
    w = World(seq)
    base = seq.state.get_meta("base")
    nxt = w.chain.add([spend((w.funds[1], 0))])
    b = parse_block(nxt)
    other.store_block(nxt)
    e = other.accept(b)
    assert e is not None and e.height is not None
    planted = MuHash()
    planted.insert(b"not this block's coins")
    # a basis that does not hold (another height): ignored, the holder computes the delta
    seq.state.commit(deltas={b.hash: PreparedDelta(basis(base, e.height + 1), planted.to_bytes(), 7, 7)})
    _advance(seq)
    w.check()
    # the right basis: taken as it is (the holder trusts it: here it is wrong on purpose)
    nxt = w.chain.add([spend((w.funds[2], 0))])
    b = parse_block(nxt)
    other.store_block(nxt)
    e = other.accept(b)
    assert e is not None
    parent = seq.state.get_commitment(e.parent)
    assert parent is not None
    seq.state.commit(deltas={b.hash: PreparedDelta(basis(base, e.height), planted.to_bytes(), 7, 7)})
    _advance(seq)
    got = seq.state.get_commitment(b.hash)
    assert got is not None and (got.utxos, got.satoshis) == (parent.utxos + 7, parent.satoshis + 7)
    assert seq.state.get_delta(b.hash) is None  # gone with the block's commit


def test_a_read_that_straddles_a_block_taken_off_the_chain_prepares_nothing(
    seq: Sequencer, other: Sequencer
) -> None:
    w = World(seq)
    t = spend((w.funds[1], 0), n_outputs=2)
    w.add([t])
    nxt = w.chain.add([spend((t, 0)), spend((w.funds[3], 0))])
    b = parse_block(nxt)
    other.store_block(nxt)
    assert other.accept(b) is not None
    real = other.utxo.get_outputs

    def bumped(ops):  # the holder starts taking a block off the chain while the preparer reads
        out = real(ops)
        seq.state.commit(meta={EPOCH: str(int(seq.state.get_meta(EPOCH) or 0) + 1)})
        return out

    other.utxo.get_outputs = bumped  # type: ignore[method-assign]
    try:
        assert other.prepare_ahead(budget_s=30) == 0
    finally:
        other.utxo.get_outputs = real  # type: ignore[method-assign]
    assert seq.state.get_delta(b.hash) is None
    assert other.prepare_ahead(budget_s=30) == 1  # undisturbed, it is made
    _advance(seq)
    w.check()


def test_deltas_prepared_on_a_branch_that_a_reorg_leaves_and_takes_again(
    seq: Sequencer, other: Sequencer
) -> None:
    """A reorg mines `t` at another height on the heavier branch: a delta prepared for a block
    spending `t`'s coins on the first branch must not be taken on the second, and the preparer
    must not take `t`'s coins, kept from the first branch, for the second's blocks."""
    w = World(seq)
    fork = len(w.chain.blocks) - 1
    t = spend((w.funds[1], 0), n_outputs=2)
    first = w.chain
    for raw in (first.add([t]), first.add([spend((t, 0))])):  # t at 1002, its coin spent at 1003
        other.store_block(raw)
        assert other.accept(parse_block(raw)) is not None
    assert other.prepare_ahead(budget_s=30) == 2
    side = first.fork(fork)
    side.add([spend((w.funds[2], 0))])  # 1002 without t
    side.add([t])  # t at 1003
    side.add([spend((t, 1)), spend((w.funds[4], 0))])  # its other coin, at 1004: heavier now
    for raw in side.blocks[fork + 1 :]:
        other.store_block(raw)
        assert other.accept(parse_block(raw)) is not None
    assert other.prepare_ahead(budget_s=30) == 3  # the heavier branch is the best now
    _advance(seq)
    w.chain = side
    w.check()
    # and back: the first branch grows heavier again, its deltas (made for the same basis) stand
    for raw in (first.add([spend((w.funds[5], 0))]), first.add([spend((t, 1))])):
        other.store_block(raw)
        assert other.accept(parse_block(raw)) is not None
    other.prepare_ahead(budget_s=30)  # (none: a reorg is pending, the tip is not the fork point)
    _advance(seq)
    w.chain = first
    w.check()
    for blk in first.blocks[fork + 1 :]:
        e = seq.state.get_block(parse_block(blk).hash)
        assert e is not None and e.status is BlockStatus.APPLIED
