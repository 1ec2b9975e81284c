"""Blocks prepared ahead of the chain (`workers.chainstate.prepare`): a second sequencer on the same stores
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
from chain import TxIn, parse_block
from chain.build import build_block, build_tx, coinbase_tx, spend_input
from chain.muhash import MuHash
from stores.blob import open_blob_store
from stores.state import BlockStatus, PreparedDelta, open_state_store
from stores.utxo import open_utxo_store
from tests.pipeline.chains import commitment_model, spend
from tests.pipeline.world import World
from workers.chainstate import commitment
from workers.chainstate.commitment import muhash_hex
from workers.chainstate.prepare import EPOCH, Coins, Preparer, basis
from workers.chainstate.sequencer import ChainBusy, Sequencer, Unfinished
from workers.demo.demochain import block_hash


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
    i = chain.setup - 2  # the coinbases maturing, applied at once: nothing there to prepare
    for raw, b in zip(chain.raws[:i], blocks[:i]):
        other.store_block(raw)
        assert other.accept(b) is not None
    _advance(seq)
    while i < len(blocks):
        n = rng.randrange(1, 4)
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
    assert made >= 4 and taken >= 3  # blocks were prepared ahead and taken … and none is left
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


def _idx(s: Sequencer, raw: bytes) -> None:
    s.store_block(raw)
    assert s.accept(parse_block(raw)) is not None


def _matches_the_store(seq: Sequencer) -> None:
    """The tip's commitment is the store's confirmed set's, computed afresh."""
    tip = seq.state.tip()
    assert tip is not None
    stored = seq.state.get_commitment(tip.hash)
    fresh = commitment.of_utxos(seq.utxo.iter_utxos(confirmed=True))
    assert stored is not None and (muhash_hex(stored), stored.utxos, stored.satoshis) == (
        muhash_hex(fresh), fresh.utxos, fresh.satoshis)


def test_a_walk_laid_out_while_the_holder_switches_branches_keeps_no_coin_of_the_other(
    seq: Sequencer, other: Sequencer
) -> None:
    """t is mined at 1003 on branch S (prepared first, its coins kept) and at 1002 on branch T.
    While the preparer lays out its walk over T's blocks, the holder switches to S (applying
    S's blocks above the walk's tip): S's block is applied, but it is no ancestor of the walk's
    blocks, and its coins (hashed at 1003) must not stand in for t's at 1002."""
    w = World(seq)
    fork = len(w.chain.blocks) - 1
    t = spend((w.funds[1], 0), n_outputs=2)
    main = w.chain
    s = main.fork(fork)
    s.add([spend((w.funds[2], 0))])  # S1 at 1002
    s.add([t])  # S2 at 1003: t
    for raw in s.blocks[fork + 1 :]:
        _idx(other, raw)
    assert other.prepare_ahead(30) == 2  # S's blocks, t's coins kept at 1003
    main.add([t])  # T1 at 1002: t
    main.add([spend((t, 0))])  # P1 at 1003 spends t's coin
    main.add([spend((w.funds[3], 0))])  # P2 at 1004: T is the heavier now
    for raw in main.blocks[fork + 1 :]:
        _idx(other, raw)
    t1 = parse_block(main.blocks[fork + 1]).hash
    while seq.state.tip().hash != t1:  # type: ignore[union-attr]
        try:
            seq.advance(budget_s=0)
        except Unfinished:
            pass
    real = Preparer._forget_off_chain

    def racing(self: Preparer, path: list, tip_height: int) -> None:
        Preparer._forget_off_chain = real  # type: ignore[method-assign]
        s.add([spend((w.funds[4], 0))])  # S grows heavier: the holder reorgs to it now
        s.add([spend((w.funds[5], 0))])
        for raw in s.blocks[-2:]:
            _idx(seq, raw)
        _advance(seq)
        assert seq.state.tip().hash == s.parent  # type: ignore[union-attr]
        real(self, path, tip_height)

    Preparer._forget_off_chain = racing  # type: ignore[method-assign]
    try:
        other.prepare_ahead(30)
    finally:
        Preparer._forget_off_chain = real  # type: ignore[method-assign]
    main.add([spend((w.funds[6], 0))])  # and T again, heavier: P1 is applied, with its delta if any
    main.add([spend((w.funds[7], 0))])
    for raw in main.blocks[-2:]:
        _idx(seq, raw)
    other.prepare_ahead(30)
    _advance(seq)
    assert seq.state.tip().hash == main.parent  # type: ignore[union-attr]
    w.check()
    _matches_the_store(seq)


def test_a_rebase_leaves_no_height_of_the_old_base_in_the_preparer(
    urls: tuple[str, str], tmp_path: Path
) -> None:
    """Blocks that state no height: the first is the base at 0; the preparer prepares the next at
    height 1; a block arrives below the base (a rebase: every height one more). A block
    spending the second's output is prepared afterwards: nothing of height 1 may be used."""
    blobs = f"file://{tmp_path}/blobs"

    def make() -> Sequencer:
        return Sequencer(open_utxo_store(urls[0], blob_url=blobs), open_state_store(urls[1]),
                         open_blob_store(blobs), allow_missing_inputs=True)

    seq, other = make(), make()
    try:
        tags = iter(range(1000, 10**6))

        def script() -> bytes:
            return b"\x51\x04" + next(tags).to_bytes(4, "big")

        def block(prev: bytes, txs: list, t: int) -> bytes:  # version 1: no BIP34 height
            cb = coinbase_tx(0, [(50 * 10**8, script())], tag=next(tags).to_bytes(4, "big"))
            return build_block(prev, [cb, *txs], timestamp=1_700_000_000 + t, version=1)

        x0 = block(b"\x77" * 32, [], 0)
        x1 = block(block_hash(x0), [], 1)
        t2 = build_tx([TxIn(b"\x66" * 32, 0, b"\x51", 0xFFFFFFFF)], [(10**6, script())])  # (missing input)
        x2 = block(block_hash(x1), [t2], 2)
        x3 = block(block_hash(x2), [build_tx([spend_input(t2, 0)], [(10**6 - 1000, script())])], 3)
        _idx(seq, x1)
        _idx(seq, x2)
        while True:  # x1 applied, the base at height 0
            try:
                seq.advance(budget_s=0)
            except Unfinished:
                pass
            if seq.state.tip() is not None:
                break
        other.prepare_ahead(30)  # x2 at height 1: no delta (its input is missing), its coins kept
        assert other._preparer is not None and block_hash(x2) in other._preparer.coins.makers()
        _idx(seq, x0)  # below the base: a rebase (x1 at 1, x2 at 2), carried out up to x1 only
        for _ in range(20):
            try:
                seq.advance(budget_s=0)
            except Unfinished:
                pass
            tip = seq.state.tip()
            if tip is not None and tip.hash == block_hash(x1):
                break
        assert seq.state.get_block(block_hash(x2)).height == 2  # type: ignore[union-attr]
        _idx(seq, x3)
        other.prepare_ahead(30)
        _advance(seq)
        assert seq.state.tip().hash == block_hash(x3)  # type: ignore[union-attr]
        _matches_the_store(seq)
    finally:
        for s in (seq, other):
            s.utxo.close()
            s.state.close()


def test_kept_coins_against_a_model() -> None:
    """`Coins` (makers kept beside each generation) against a plain dict of every coin added,
    trimmed the way the generations are: random blocks' coins added, forgotten by `keep_only`
    and dropped with the old generation; `get` and `makers` always agree with the model."""
    rng = random.Random(7)
    coins = Coins(max_coins=40)
    young: dict[tuple[bytes, int], tuple[int, int, bytes]] = {}
    old: dict[tuple[bytes, int], tuple[int, int, bytes]] = {}
    made = 0
    for step in range(400):
        if rng.random() < 0.7:
            maker = made.to_bytes(32, "little")
            made += 1
            batch = {(maker, v): (rng.getrandbits(64), v, maker) for v in range(rng.randint(0, 12))}
            if len(young) + len(batch) > 20:
                old, young = young, {}
            young.update(batch)
            coins.add(batch)
        else:
            present = sorted({c[2] for d in (young, old) for c in d.values()})
            keep = set(rng.sample(present, k=rng.randint(0, len(present))))
            young = {op: c for op, c in young.items() if c[2] in keep}
            old = {op: c for op, c in old.items() if c[2] in keep}
            coins.keep_only(keep)
        assert coins.makers() == {c[2] for d in (young, old) for c in d.values()}, step
        for op in [*young, *old, (made.to_bytes(32, "little"), 0)]:
            assert coins.get(op) == young.get(op, old.get(op)), step
