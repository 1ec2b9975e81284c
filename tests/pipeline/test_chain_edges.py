"""Edges of the chain reviews found, on both SQL backends: a reclaim that meets a rival mined on
the chain; two ancestors arriving before a rebase; a crash at any depth of a disconnection's
conflict swap; a disconnection never writing into another block's undo record; blocks refused
for what blocks not seen yet would answer (outputs, a parent mined), with their descendants,
while the chain's start is unknown — placed again when those arrive; a genesis arriving below a
known start; a rebase long after the start, its undo records kept. (A block spending what a
mempool tx spent before its record was made: test_takeover.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from chain import iter_blk_records, parse_block
from stores.state import BlockStatus
from tests.pipeline.chains import SNAPSHOT_HASH, SNAPSHOT_HEIGHT, Chain, spend
from tests.pipeline.test_chain_steps import short_memory
from tests.pipeline.world import World
from workers.chainstate.blockindex import START_UNKNOWN
from workers.chainstate.conflicts import Conflicts
from workers.chainstate.sequencer import DISCONNECTING, Sequencer


def status(seq: Sequencer, raw: bytes) -> BlockStatus:
    e = seq.state.get_block(parse_block(raw).hash)
    assert e is not None
    return e.status


def test_reclaiming_against_a_rival_mined_on_the_chain_is_refused(seq: Sequencer) -> None:
    """Branch B mines t (spending o); A mines r (spending o too) and wins, so t is conflicting;
    a third block of A mining t again double-spends o against r, mined on A: it is refused,
    and r stays mined and not conflicting."""
    w = World(seq)
    o = (w.funds[1], 0)
    t, r = spend(o), spend(o, fee=2000)
    a, b = w.chain.fork(0), w.chain.fork(0)
    seq.submit(b.add([t]))
    seq.submit(a.add([r]))
    seq.submit(a.add())
    assert seq.utxo.get(t.txid).conflicting
    e = seq.submit(a.next_block([t]))
    assert e.status is BlockStatus.INVALID and "already spent on this chain" in (e.reason or ""), e
    assert seq.state.tip().hash == a.parent  # type: ignore[union-attr]
    got = seq.utxo.get(r.txid)
    assert not got.conflicting and len(got.block_heights) == 1
    assert seq.utxo.get(t.txid).conflicting
    op = (o[0].txid, 0)
    assert seq.utxo.get_outputs([op])[op].spending_txid == r.txid


def test_two_ancestors_arriving_before_the_rebase(seq: Sequencer) -> None:
    """Blocks 2-5 are applied from block 2; blocks 1 and 0 are indexed before the chain's holder
    runs: the rebase starts from block 0, not from block 1 (whose parent is then known)."""
    c = Chain()
    for _ in range(6):
        c.add()
    for raw in c.blocks[2:]:
        seq.submit(raw)
    for raw in (c.blocks[1], c.blocks[0]):
        seq.store_block(raw)
        assert seq.accept(parse_block(raw)) is not None
    tip = seq.advance()
    assert tip is not None and tip.hash == c.parent and tip.height == 6
    assert seq.state.counts() == {"applied": 6}


class Killed(BaseException):
    """The process dies here (nothing after it in that process runs)."""


def die_at_park(monkeypatch: pytest.MonkeyPatch, nth: int = 1) -> None:
    """The process dies once a conflict swap has marked its `nth` transaction conflicting, its
    spends still held (`Conflicts._mark`)."""
    seen = [0]
    mark = Conflicts._mark

    def dying(self: Conflicts, t: bytes, already: bool) -> None:
        mark(self, t, already)
        seen[0] += 1
        if seen[0] == nth:
            raise Killed()

    monkeypatch.setattr(Conflicts, "_mark", dying)


def coinbase_spent_then_reorged(seq: Sequencer, w: World) -> tuple[Chain, bytes]:
    """Block 1101 spends block 1001's coinbase (and funds[2]) in x; a side branch from the
    snapshot, one block longer, spends funds[2] too in its last block (not yet submitted). The
    side branch and the raw last block."""
    coinbase = w.chain.txs[-1][0]
    while w.chain.height < 1101:
        w.add()
    x = spend((coinbase, 0), (w.funds[2], 0))
    w.add([x])
    w.txs[x.txid] = x
    side = Chain(SNAPSHOT_HASH, SNAPSHOT_HEIGHT + 1)
    for _ in range(w.chain.height - SNAPSHOT_HEIGHT - 1):
        seq.submit(side.add())
    return side, side.add([spend((w.funds[2], 0))])


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.timeout(300)
def test_a_crash_in_a_disconnections_swap_is_finished(
    seq: Sequencer, monkeypatch: pytest.MonkeyPatch, nth: int
) -> None:
    """The worker disconnecting block 1101 dies in the swap that makes x (the coinbase's
    spender), then its mempool child y and grandchild z conflicting: after marking the `nth`
    of them, before any spend is released. The next pass finishes the disconnection: all three
    conflicting, none holding a spend, and the side branch's spend of funds[2] goes through."""
    w = World(seq)
    side, last = coinbase_spent_then_reorged(seq, w)
    x = w.chain.txs[-1][1]
    y = spend((x, 0))
    z = spend((y, 0))
    w.mempool(y, z)
    die_at_park(monkeypatch, nth)
    seq.store_block(last)
    seq.accept(parse_block(last))
    with pytest.raises(Killed):
        seq.advance()
    assert seq.state.get_meta(DISCONNECTING) is not None
    tip = seq.advance()
    assert tip is not None and tip.hash == side.parent
    assert seq.state.get_meta(DISCONNECTING) is None
    cb = w.chain.txs[-101][0]
    ops = [(w.funds[2].txid, 0), (cb.txid, 0), (x.txid, 0), (y.txid, 0)]
    outs = seq.utxo.get_outputs(ops)
    assert outs[ops[0]].spending_txid == side.txs[-1][1].txid
    assert [outs[op].spending_txid for op in ops[1:]] == [None, None, None]  # every spend released
    assert [seq.utxo.get(t.txid).conflicting for t in (x, y, z)] == [True, True, True]


@pytest.mark.timeout(300)
def test_a_disconnection_writes_into_no_undo_record(seq: Sequencer) -> None:
    """The swap a disconnection makes (the coinbase's spender conflicting) is noted nowhere:
    the disconnected block has no undo record, and the last applied block's is unchanged."""
    w = World(seq)
    side, last = coinbase_spent_then_reorged(seq, w)
    seq.submit(last)
    assert seq.state.tip().hash == side.parent  # type: ignore[union-attr]
    assert seq.state.get_undo(parse_block(w.chain.blocks[-1]).hash) is None
    undo = seq.state.get_undo(parse_block(last).hash)
    assert undo is not None and "conflicted" not in undo and undo["state"] == "applied"


def test_a_first_block_refused_for_outputs_not_seen_yet_is_placed_again(seq: Sequencer) -> None:
    """No snapshot: block 102 (spending block 1's coinbase) arrives first, is the base, and is
    refused — provisionally, its reason says. Blocks 1-101 arrive: 102 is placed again on
    them and applied; so is 103."""
    c = Chain()
    for _ in range(101):
        c.add()
    c.add([spend((c.txs[0][0], 0))])
    c.add()
    first = seq.submit(c.blocks[101])
    assert first.status is BlockStatus.INVALID and (first.reason or "").endswith(START_UNKNOWN), first
    for raw in [*c.blocks[:101], c.blocks[102]]:
        seq.submit(raw)
    tip = seq.state.tip()
    assert tip is not None and tip.hash == c.parent, tip
    assert status(seq, c.blocks[101]) is BlockStatus.APPLIED


def test_blocks_above_a_provisional_refusal_are_placed_again_with_it(seq: Sequencer) -> None:
    """Blocks 102-104 arrive first: 102 is refused provisionally, 103 and 104 for their parent;
    when 1-101 arrive, all three are placed again and applied."""
    c = Chain()
    for _ in range(101):
        c.add()
    c.add([spend((c.txs[0][0], 0))])
    c.add()
    c.add()
    for raw in c.blocks[101:]:
        seq.submit(raw)
    assert status(seq, c.blocks[103]) is BlockStatus.INVALID
    for raw in c.blocks[:101]:
        seq.submit(raw)
    tip = seq.state.tip()
    assert tip is not None and tip.hash == c.parent and tip.height == 104, tip


def test_spending_a_mempool_tx_a_block_not_seen_yet_mines_is_provisional(seq: Sequencer) -> None:
    """No snapshot: T is in the mempool; block 103 (spending T) arrives first and is refused —
    T is not mined on the chain, yet. Blocks 1-102 arrive, 102 mining T: 103 is applied."""
    c = Chain()
    for _ in range(101):
        c.add()
    t = spend((c.txs[0][0], 0))
    c.add([t])
    c.add([spend((t, 0))])
    seq.utxo.create_many([t], 0)
    first = seq.submit(c.blocks[102])
    assert first.status is BlockStatus.INVALID and (first.reason or "").endswith(START_UNKNOWN), first
    for raw in c.blocks[:102]:
        seq.submit(raw)
    tip = seq.state.tip()
    assert tip is not None and tip.hash == c.parent, tip


# The mainnet genesis block (its header hashes to the well-known hash; its one transaction is
# its merkle root): public, and small enough to write out.
GENESIS_RAW = bytes.fromhex(
    "0100000000000000000000000000000000000000000000000000000000000000000000003ba3edfd7a7b12b27ac7"
    "2c3e67768f617fc81bc3888a51323a9fb8aa4b1e5e4a29ab5f49ffff001d1dac2b7c01010000000100000000000000"
    "00000000000000000000000000000000000000000000000000ffffffff4d04ffff001d0104455468652054696d6573"
    "2030332f4a616e2f32303039204368616e63656c6c6f72206f6e206272696e6b206f66207365636f6e64206261696c"
    "6f757420666f722062616e6b73ffffffff0100f2052a01000000434104678afdb0fe5548271967f1a67130b7105cd6"
    "a828e03909a67962e0ea1f61deb649f6bc3f4cef38c4f35504e51ec112de5c384df7ba0b8d578a4c702b6bf11d5fac"
    "00000000"
)


def test_a_genesis_arriving_below_a_known_start_changes_nothing(seq: Sequencer, data_dir: Path) -> None:
    """Mainnet blocks 1-5 applied (block 1 follows the well-known genesis: the start is known,
    and block 1 is at height 1 already); the genesis block arriving then makes no rebase (a
    replay of the whole chain for a coinbase no one can spend): the chain stays as it is."""
    genesis = parse_block(GENESIS_RAW)
    assert genesis.hash[::-1].hex() == "000000000019d6689c085ae165831e934ff763ae46a2a6c172b3f1b60a8ce26f"
    raws = [raw for _off, raw in iter_blk_records((data_dir / "mainnet-1-255.blk").read_bytes())]
    for raw in raws[:5]:
        seq.submit(raw)
    assert seq.index.start_known()
    e = seq.submit(GENESIS_RAW)
    assert e.status is BlockStatus.ORPHAN, e
    assert seq.state.get_meta("rebase") is None
    tip = seq.state.tip()
    assert tip is not None and tip.height == 5 and tip.hash == parse_block(raws[4]).hash
    assert seq.state.counts() == {"applied": 5, "orphan": 1}


def test_a_rebase_long_after_the_start_finds_every_undo_record(
    urls: tuple[str, str], tmp_path: Path, data_dir: Path
) -> None:
    """Mainnet blocks 2-8 applied first (block 2 at height 0: its parent unknown, no BIP34),
    with a retention of 2; then block 1 arrives: every block is taken back whole (the undo
    records were kept, the start being unknown) and applied again at its true height."""
    seq = short_memory(urls, tmp_path, retention=2)
    try:
        raws = [raw for _off, raw in iter_blk_records((data_dir / "mainnet-1-255.blk").read_bytes())]
        for raw in raws[1:8]:
            seq.submit(raw)
        assert seq.state.get_undo(parse_block(raws[1]).hash) is not None
        for raw in [raws[0], *raws[8:12]]:
            seq.submit(raw)
        tip = seq.state.tip()
        assert tip is not None and tip.height == 12
        cb = seq.utxo.get(parse_block(raws[1]).txs[0].txid)
        assert list(cb.block_heights) == [2] and cb.spending_height == 102
        assert seq.state.get_undo(parse_block(raws[1]).hash) is None  # start known: pruned now
    finally:
        seq.utxo.close()
        seq.state.close()
